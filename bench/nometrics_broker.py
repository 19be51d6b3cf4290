"""``python -m bench.nometrics_broker broker ...``: the broker without its per-request
histograms, for ``bench.obs cost`` only.

It flips the internal ``BrokerConfig.request_metrics`` field after the ordinary flags are
parsed (the connection hook then only counts connections); every other metric stays.
"""

from __future__ import annotations

from bench.patched_broker import run_with

if __name__ == "__main__":
    raise SystemExit(run_with(request_metrics=False))
