"""Benchmark harnesses (not tests): ``python -m bench.broker``, ``bench.groups``, ...."""
