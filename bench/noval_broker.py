"""``python -m bench.noval_broker broker ...``: the broker with full produce validation
switched off, for ``bench.broker``'s ``noval`` target only.

It flips the internal ``BrokerConfig.validate_records`` field (left with the checks the
broker made before issue 16: framing, CRC, header fields) after the ordinary flags are
parsed. There is deliberately no flag or environment variable for this: without
validation a client can poison a partition.
"""

from __future__ import annotations

from bench.patched_broker import run_with

if __name__ == "__main__":
    raise SystemExit(run_with(validate_records=False))
