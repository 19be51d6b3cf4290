"""``python -m bench.noval_broker broker ...``: the broker with full produce validation
switched off, for ``bench.broker``'s ``noval`` target only.

It flips the internal ``BrokerConfig.validate_records`` field (left with the checks the
broker made before issue 16: framing, CRC, header fields) after the ordinary flags are
parsed. There is deliberately no flag or environment variable for this: without
validation a client can poison a partition.
"""

from __future__ import annotations

import dataclasses
import sys

import broker.cli_broker as cli
from broker.config import BrokerConfig

_parse = cli.config_from_args


def _unvalidated(argv: list[str]) -> tuple[BrokerConfig, str]:
    config, level = _parse(argv)
    return dataclasses.replace(config, validate_records=False), level


cli.config_from_args = _unvalidated

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["broker"]:  # invoked like ``kafscale broker ...``
        args = args[1:]
    raise SystemExit(cli.main(args))
