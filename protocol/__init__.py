"""Kafka wire protocol: framing, headers, API bodies, record batches, compression.

This package does no I/O and never imports asyncio.
"""
