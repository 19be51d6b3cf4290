"""The ``kafscale`` command line: one layer under every sub-command (README.md).

- **Environment fallback**: every flag of every sub-command can also be given as an
  environment variable, ``--flush-interval-ms`` as ``KAFSCALE_FLUSH_INTERVAL_MS`` (upper
  case, ``-`` becomes ``_``); a flag on the command line wins. :class:`EnvParser` is the
  argparse parser that does it. The broker and the ingest job warn of a ``KAFSCALE_*``
  variable that is no setting of theirs (a misspelling is not ignored in silence).
- **Booleans**: :func:`parse_bool` and its one list of true and false strings.
- **Dispatch**: :data:`COMMANDS` maps a command (``broker``, ``segments inspect``, ...) to
  the ``module:function`` that runs it; the module is imported only when that command
  runs, so ``kafscale groups`` never loads Spark. A command whose optional dependency is
  missing (the ingest extras) exits with one line naming what to install.

To add a command, add a row to :data:`COMMANDS`; its function takes the remaining
arguments and returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO, cast

ENV_PREFIX = "KAFSCALE_"

#: the variables read from the environment directly, not through a flag: no command warns
#: of them (:meth:`EnvParser.warn_unknown_env`)
ENV_ONLY: dict[str, str] = {
    "KAFSCALE_FAULT_PAUSE": "freeze at a fault checkpoint (broker/faults.py; tests)",
    "KAFSCALE_DIRECT_IO": "the local store's O_DIRECT writes (segments/local_files.py)",
    "KAFSCALE_KEEP_PAGE_CACHE": "the local store's page cache (segments/local_files.py)",
    "KAFSCALE_PURE_PYTHON": "no native extensions (protocol/native.py)",
    "KAFSCALE_NO_NATIVE": "no native build expected (the tests)",
    "KAFSCALE_INGEST_PROFILE": "profile the ingest tasks (ingest_job/task.py)",
    "KAFSCALE_INGEST_KILL_AT": "kill the ingest job at a step (ingest_job/catalog.py; tests)",
    "KAFSCALE_USER_PASSWORD": "kafscale users create's password (broker/cli_security.py)",
}
TRUE_STRINGS = frozenset({"1", "true", "yes", "on"})
FALSE_STRINGS = frozenset({"0", "false", "no", "off", ""})


# ------------------------------------------------------------------ environment and booleans


def env_name(flag: str) -> str:
    """``--flush-bytes`` -> ``KAFSCALE_FLUSH_BYTES``."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def env_value(flag: str) -> str | None:
    """The value of ``flag``'s environment variable, or None when it is not set."""
    return os.environ.get(env_name(flag))


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` -> True, ``0/false/no/off`` or empty -> False (any case);
    anything else raises ValueError."""
    value = text.strip().lower()
    if value in TRUE_STRINGS:
        return True
    if value in FALSE_STRINGS:
        return False
    raise ValueError(
        f"not a boolean: {text!r} (true: {', '.join(sorted(TRUE_STRINGS))}; "
        f"false: {', '.join(sorted(s for s in FALSE_STRINGS if s))})"
    )


def bool_arg(text: str) -> bool:
    """:func:`parse_bool` as an argparse ``type``."""
    try:
        return parse_bool(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True, slots=True)
class _EnvOption:
    flag: str
    dest: str
    default: Any
    convert: Callable[[str], Any] | None
    choices: Sequence[str] | None
    append: bool = False  # repeatable; the environment variable is a comma list


class EnvParser:
    """An ``argparse.ArgumentParser`` whose options fall back to ``KAFSCALE_<FLAG>``.

    Options are added with :meth:`option` (a value) and :meth:`switch` (on/off); add
    anything else (positionals, sub-parsers) to :attr:`parser` directly. After parsing, an
    option not given on the command line takes its environment variable, else its default;
    a bad environment value is a usage error naming the variable (exit 2).
    """

    def __init__(self, prog: str, description: str | None = None) -> None:
        self.parser = argparse.ArgumentParser(prog=prog, description=description)
        self._options: list[_EnvOption] = []

    def option(
        self,
        flag: str,
        help: str,
        *,
        default: Any = None,
        type: Callable[[str], Any] | None = None,
        choices: Sequence[str] | None = None,
        append: bool = False,
    ) -> None:
        """``flag VALUE``. A string ``default`` goes through ``type`` like a given value.
        ``append``: the flag repeats (a list; its variable holds a comma-separated list)."""
        action = self.parser.add_argument(
            flag,
            default=None,
            type=type or str,
            choices=choices,
            action="append" if append else "store",
            help=f"{help} (env {env_name(flag)}{', comma-separated' if append else ''})",
        )
        self._options.append(_EnvOption(flag, action.dest, default, type, choices, append))

    def switch(self, flag: str, help: str) -> None:
        """``flag`` alone turns it on; ``KAFSCALE_<FLAG>`` is read with :func:`parse_bool`."""
        action = self.parser.add_argument(
            flag, action="store_const", const=True, default=None,
            help=f"{help} (env {env_name(flag)}=true)",
        )  # fmt: skip
        self._options.append(_EnvOption(flag, action.dest, False, parse_bool, None))

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        ns = self.parser.parse_args(list(argv))
        for opt in self._options:
            if getattr(ns, opt.dest, None) is not None:
                continue  # the flag wins
            raw = env_value(opt.flag)
            if raw is not None:
                setattr(ns, opt.dest, self._from_env(opt, raw))
            elif isinstance(opt.default, str) and opt.convert is not None:
                setattr(ns, opt.dest, opt.convert(opt.default))
            else:
                setattr(ns, opt.dest, opt.default)
        return ns

    def _from_env(self, opt: _EnvOption, raw: str) -> Any:
        if opt.append:
            items = [x.strip() for x in raw.split(",") if x.strip()]
            return [self._from_env(_EnvOption(opt.flag, opt.dest, None, opt.convert,
                                              opt.choices), x) for x in items]  # fmt: skip
        try:
            value = opt.convert(raw) if opt.convert is not None else raw
        except (ValueError, argparse.ArgumentTypeError) as exc:
            kind = getattr(opt.convert, "__name__", "")
            reason = f"invalid {kind} value" if kind in ("int", "float") else str(exc)
            self.error(f"{env_name(opt.flag)}={raw!r}: {reason}")
        if opt.choices is not None and value not in opt.choices:
            self.error(f"{env_name(opt.flag)}={raw!r}: choose from {', '.join(opt.choices)}")
        return value

    def variables(self) -> set[str]:
        """The environment variable of every option."""
        return {env_name(o.flag) for o in self._options}

    def unknown_env(self) -> list[str]:
        """The ``KAFSCALE_*`` variables set that no flag of this command reads (nor anything
        else, :data:`ENV_ONLY`): a misspelt one would otherwise be ignored in silence."""
        known = self.variables() | ENV_ONLY.keys()
        return sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and k not in known)

    def warn_unknown_env(self, logger: logging.Logger) -> None:
        """One warning per :meth:`unknown_env` variable (as Kafka warns of a setting it
        was given and does not know)."""
        for name in self.unknown_env():
            logger.warning("%s is set but %s has no such setting: ignored", name, self.prog)

    @property
    def prog(self) -> str:
        return self.parser.prog

    def error(self, message: str) -> NoReturn:
        self.parser.error(message)

    def format_help(self) -> str:
        return self.parser.format_help()


# ------------------------------------------------------------------------------- dispatch


@dataclass(frozen=True, slots=True)
class Command:
    target: str  # "module:function"; the function takes argv and returns the exit code
    summary: str


#: command words -> what runs them. The longest match of the leading arguments wins.
COMMANDS: dict[str, Command] = {
    "broker": Command("broker.cli_broker:main", "run a broker (kafscale broker --help)"),
    "groups": Command(
        "broker.cli_groups:main", "list | describe GROUP | reset-offsets ... | delete GROUP"
    ),
    "users": Command("broker.cli_security:users_main", "create | delete | list SCRAM users"),
    "acls": Command("broker.cli_acls:main", "add | remove | list ACL bindings"),
    "segments inspect": Command("segments.inspect:main", "PATH|URL [--verify]: validate a segment"),
    "partitions truncate": Command(
        "broker.repair:truncate_main", "TOPIC PARTITION --to N: cut a partition back (repair)"
    ),
    "ingest": Command("ingest_job.cli:main", "turn committed segments into Iceberg tables"),
    "ingest maintain": Command(
        "ingest_job.cli:maintain_main", "compact, expire snapshots, remove orphan files"
    ),
}

#: optional top-level modules -> what to install when one is missing
OPTIONAL_MODULES: dict[str, str] = {
    name: "install the ingest extras: pip install 'kafscale[ingest]'"
    for name in ("pyspark", "pyiceberg", "pyarrow", "py4j")
}


def missing_optional(exc: ModuleNotFoundError) -> str | None:
    """The one-line advice for a missing optional module, or None for any other."""
    root = (exc.name or "").partition(".")[0]
    hint = OPTIONAL_MODULES.get(root)
    return f"{root} is not installed; {hint}" if hint else None


def run_guarded(prog: str, func: Callable[[list[str]], int], argv: Sequence[str]) -> int:
    """``func(argv)``, turning a missing optional dependency into one line and exit 1."""
    try:
        return func(list(argv))
    except ModuleNotFoundError as exc:
        advice = missing_optional(exc)
        if advice is None:
            raise
        print(f"{prog}: {advice}", file=sys.stderr, flush=True)
        return 1


def _load(target: str) -> Callable[[list[str]], int]:
    module, _, func = target.partition(":")
    return cast(Callable[[list[str]], int], getattr(importlib.import_module(module), func))


def _match(argv: Sequence[str]) -> str | None:
    for n in range(min(len(argv), 3), 0, -1):
        name = " ".join(argv[:n])
        if name in COMMANDS:
            return name
    return None


def usage(prefix: str = "") -> str:
    """Usage of every command (or of those starting with ``prefix``)."""
    names = [n for n in COMMANDS if not prefix or n.split()[0] == prefix]
    width = max(len(n) for n in names)
    tops = ",".join(dict.fromkeys(n.split()[0] for n in names))  # in table order
    head = f"usage: kafscale {prefix} ..." if prefix else f"usage: kafscale {{{tops}}} ..."
    return "\n".join([head, ""] + [f"  {n.ljust(width)}   {COMMANDS[n].summary}" for n in names])


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``kafscale``: dispatch to the command's module."""
    args = list(sys.argv[1:] if argv is None else argv)
    name = _match(args)
    if name is None:
        known = bool(args) and any(n.split()[0] == args[0] for n in COMMANDS)
        helping = bool(set(args[: 2 if known else 1]) & {"-h", "--help"})
        text = usage(args[0] if known else "")
        if args and not known and not helping:
            text = f"kafscale: unknown command {args[0]!r}\n{text}"
        print(text, file=(out or sys.stdout) if helping else sys.stderr)
        return 0 if helping else 2
    rest = args[len(name.split()) :]
    return run_guarded(f"kafscale {name}", lambda a: _load(COMMANDS[name].target)(a), rest)


if __name__ == "__main__":
    sys.exit(main())
