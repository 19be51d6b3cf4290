"""``python -m bench.nometrics_broker broker ...``: the broker without its per-request
histograms, for ``bench.obs cost`` only.

It flips the internal ``BrokerConfig.request_metrics`` field after the ordinary flags are
parsed (the connection hook then only counts connections); every other metric stays.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import broker.cli_broker as cli
from broker.config import BrokerConfig

_parse = cli.config_from_args


def _without_request_metrics(argv: Sequence[str]) -> tuple[BrokerConfig, str]:
    config, level = _parse(argv)
    return dataclasses.replace(config, request_metrics=False), level


cli.config_from_args = _without_request_metrics

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["broker"]:  # invoked like ``kafscale broker ...``
        args = args[1:]
    raise SystemExit(cli.main(args))
