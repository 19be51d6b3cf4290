"""Run ``kafscale broker`` with internal ``BrokerConfig`` fields overridden after the
ordinary flags are parsed (``bench.noval_broker``, ``bench.nometrics_broker``). These
fields deliberately have no flag or environment variable."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import broker.cli_broker as cli
from broker.config import BrokerConfig


def run_with(**overrides: Any) -> int:
    """``cli.main`` with ``overrides`` applied to the parsed configuration."""
    parse = cli.config_from_args

    def patched(argv: Sequence[str]) -> tuple[BrokerConfig, str]:
        config, level = parse(argv)
        return dataclasses.replace(config, **overrides), level

    cli.config_from_args = patched
    args = sys.argv[1:]
    if args[:1] == ["broker"]:  # invoked like ``kafscale broker ...``
        args = args[1:]
    return cli.main(args)
