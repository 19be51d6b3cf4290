"""``kafscale groups``: consumer-group tooling over the Kafka protocol.

    kafscale groups list [--state [STATES]]           [--bootstrap HOST:PORT]
    kafscale groups describe GROUP [GROUP...]         [--bootstrap HOST:PORT]
    kafscale groups reset-offsets GROUP --topic T[:P,P...] (--to-earliest | --to-latest |
                    --to-offset N | --to-datetime YYYY-MM-DDTHH:MM:SS[.sss][+HH:MM]) [--execute]
    kafscale groups delete GROUP [GROUP...]

Both kinds of group are shown: classic ones and KIP-848 consumer groups
(``group.protocol=consumer``; ``list --state`` prints each group's TYPE). Like
``kafka-consumer-groups.sh`` it talks to the broker (kafka-python's KafkaAdminClient):
describe prints GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST
CLIENT-ID; reset-offsets prints the plan and commits it only with ``--execute`` (and only
while the group has no active members). ``--bootstrap`` defaults to ``KAFSCALE_BOOTSTRAP``
or 127.0.0.1:9092.
"""

from __future__ import annotations

import argparse
import socket
import sys
import warnings
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from broker.cli import EnvParser
from broker.logfmt import FORMATS, setup_logging

EXIT_OK, EXIT_ERROR = 0, 1


def _parser() -> EnvParser:
    pp = EnvParser("kafscale groups", description=__doc__.split("\n\n")[0])
    pp.option("--bootstrap", "broker HOST:PORT (default 127.0.0.1:9092)", default="127.0.0.1:9092")
    pp.option("--log-format", "text or json: warnings on stderr", default="text", choices=FORMATS)
    sub = pp.parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list consumer groups")
    ls.add_argument("--state", nargs="?", const="", default=None, help="show states [filter]")
    d = sub.add_parser("describe", help="offsets, lag and members of groups")
    d.add_argument("groups", nargs="+")
    r = sub.add_parser("reset-offsets", help="plan (or --execute) an offset reset")
    r.add_argument("group")
    r.add_argument("--topic", required=True, action="append", help="T or T:P,P...")
    to = r.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-offset", type=int)
    to.add_argument("--to-datetime", help="YYYY-MM-DDTHH:MM:SS[.sss][+HH:MM] (local if no zone)")
    r.add_argument("--execute", action="store_true", help="commit the plan (default: dry run)")
    x = sub.add_parser("delete", help="delete groups without active members")
    x.add_argument("groups", nargs="+")
    for sp in (ls, d, r, x):
        sp.add_argument("--bootstrap", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return pp


def _admin(bootstrap: str) -> Any:
    host, _, port = bootstrap.rpartition(":")
    # fail fast, like the original tool, instead of the client's long bootstrap retries
    with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5):
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=bootstrap, client_id="kafscale-groups")


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(" ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _assigned(assignment: Any) -> list[tuple[str, int]]:
    """(topic, partition) pairs of a decoded ConsumerProtocolAssignment (object or dict)."""
    if not assignment or isinstance(assignment, bytes | bytearray):
        return []
    topics = _get(assignment, "assigned_partitions", []) or []
    out: list[tuple[str, int]] = []
    for t in topics:
        name = _get(t, "topic")
        parts = _get(t, "partitions", [])
        if name is None and isinstance(t, list | tuple):
            name, parts = t[0], t[1]
        out.extend((name, int(p)) for p in parts or [])
    return out


def _cmd_list(admin: Any, state: str | None, out: TextIO) -> int:
    states = [s for s in (state or "").split(",") if s] or None
    groups = admin.list_groups(states_filter=states) if states else admin.list_groups()
    if state is None:
        for g in sorted(groups, key=lambda g: g["group_id"]):
            out.write(g["group_id"] + "\n")
        return EXIT_OK
    rows = [["GROUP", "STATE", "TYPE"]] + [
        [g["group_id"], g.get("group_state") or "-", _group_type(g)]
        for g in sorted(groups, key=lambda g: g["group_id"])
    ]
    _table(rows, out)
    return EXIT_OK


def _group_type(listed: Any) -> str:
    """``classic`` or ``consumer`` (KIP-848), as ListGroups v5 reports it."""
    kind = listed.get("group_type")
    name = getattr(kind, "name", kind)
    return str(name).lower() if name else "-"


def _log_ends(admin: Any, tps: list[Any]) -> dict[Any, int]:
    from kafka.admin import OffsetSpec

    if not tps:
        return {}
    ends = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.LATEST))
    return {tp: v.offset for tp, v in ends.items()}


def _describe_one(admin: Any, group_id: str, out: TextIO, err: TextIO) -> int:
    from kafka import TopicPartition

    desc = admin.describe_groups([group_id])[group_id]
    if desc.get("error"):
        err.write(f"Error: describing group '{group_id}' failed: {desc['error']}\n")
        return EXIT_ERROR
    state = desc.get("group_state", "")
    committed = admin.list_group_offsets({group_id: None}).get(group_id, {})
    if state == "Dead" and not committed:
        err.write(f"Error: Consumer group '{group_id}' does not exist.\n")
        return EXIT_ERROR
    owner: dict[Any, tuple[str, str, str]] = {}
    for m in desc.get("members") or []:
        who = (m["member_id"], m.get("client_host") or "-", m.get("client_id") or "-")
        for topic, p in _assigned(m.get("member_assignment")):
            owner[TopicPartition(topic, p)] = who
    tps = sorted(set(committed) | set(owner), key=lambda tp: (tp.topic, tp.partition))
    ends = _log_ends(admin, tps)
    if not desc.get("members"):
        out.write(f"\nConsumer group '{group_id}' has no active members.\n")
    out.write("\n")
    rows = [
        "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID".split()
    ]
    for tp in tps:
        cur = committed[tp].offset if tp in committed and committed[tp].offset >= 0 else None
        end = ends.get(tp)
        lag = str(end - cur) if cur is not None and end is not None else "-"
        cid, host, client = owner.get(tp, ("-", "-", "-"))
        rows.append(
            [
                group_id,
                tp.topic,
                str(tp.partition),
                str(cur) if cur is not None else "-",
                str(end) if end is not None else "-",
                lag,
                cid,
                host,
                client,
            ]
        )
    _table(rows, out)
    return EXIT_OK


def _parse_datetime(text: str) -> int:
    ts = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(ts.timestamp() * 1000)


def _targets(admin: Any, args: argparse.Namespace) -> dict[Any, Any]:
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec
    from kafka.protocol.consumer import OffsetTimestamp

    spec: Any
    if args.to_earliest:
        spec = OffsetSpec.EARLIEST
    elif args.to_latest:
        spec = OffsetSpec.LATEST
    elif args.to_datetime is not None:
        spec = OffsetTimestamp(_parse_datetime(args.to_datetime))
    else:
        spec = int(args.to_offset)
    tps: list[Any] = []
    for item in args.topic:
        topic, _, parts = item.partition(":")
        if parts:
            tps.extend(TopicPartition(topic, int(p)) for p in parts.split(","))
        else:
            info = admin.describe_topics([topic])[0]
            tps.extend(TopicPartition(topic, p["partition_index"]) for p in info["partitions"])
    return dict.fromkeys(tps, spec)


def _plan(admin: Any, specs: dict[Any, Any]) -> dict[Any, int]:
    """The offsets a reset would commit, clamped to [earliest, latest] as Kafka does."""
    from kafka.admin import OffsetSpec

    tps = list(specs)
    earliest = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.EARLIEST))
    latest = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.LATEST))
    lookups = {tp: s for tp, s in specs.items() if type(s) is not int}
    resolved = admin.list_partition_offsets(lookups) if lookups else {}
    plan = {}
    for tp in tps:
        raw = resolved[tp].offset if tp in resolved else specs[tp]
        lo, hi = earliest[tp].offset, latest[tp].offset
        plan[tp] = hi if raw < 0 or raw > hi else max(raw, lo)
    return plan


def _cmd_reset(admin: Any, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from kafka.structs import OffsetAndMetadata

    desc = admin.describe_groups([args.group])[args.group]
    state = desc.get("group_state", "")
    if args.execute and state not in ("Empty", "Dead"):
        err.write(
            f"Error: Assignments can only be reset if the group '{args.group}' is inactive, "
            f"but the current state is {state}.\n"
        )
        return EXIT_ERROR
    plan = _plan(admin, _targets(admin, args))
    rows = [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]]
    for tp in sorted(plan, key=lambda tp: (tp.topic, tp.partition)):
        rows.append([args.group, tp.topic, str(tp.partition), str(plan[tp])])
    out.write("\n")
    _table(rows, out)
    if not args.execute:
        out.write("\n(dry run: add --execute to commit these offsets)\n")
        return EXIT_OK
    result = admin.alter_group_offsets(
        args.group, {tp: OffsetAndMetadata(off, "", None) for tp, off in plan.items()}
    )
    failed = {tp: e for tp, e in result.items() if e.errno != 0}
    for tp, e in failed.items():
        err.write(f"Error: resetting {tp.topic}-{tp.partition} failed: {e.__name__}\n")
    return EXIT_ERROR if failed else EXIT_OK


def _cmd_delete(admin: Any, groups: list[str], out: TextIO, err: TextIO) -> int:
    results = admin.delete_groups(groups)
    failed = {g: r for g, r in results.items() if r != "OK"}
    ok = [g for g in groups if g not in failed]
    if ok:
        names = ", ".join(f"'{g}'" for g in ok)
        out.write(f"Deletion of requested consumer groups ({names}) was successful.\n")
    if failed:
        err.write("Error: Deletion of some consumer groups failed:\n")
        for g, reason in failed.items():
            err.write(f"* Group '{g}' could not be deleted due to: {reason}\n")
        return EXIT_ERROR
    return EXIT_OK


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    setup_logging("WARNING", args.log_format)
    try:
        admin = _admin(args.bootstrap)
    except Exception as exc:  # noqa: BLE001 - a CLI reports and exits
        err.write(f"Error: cannot reach {args.bootstrap}: {exc}\n")
        return EXIT_ERROR
    try:
        if args.command == "list":
            return _cmd_list(admin, args.state, out)
        if args.command == "describe":
            codes = [_describe_one(admin, g, out, err) for g in args.groups]
            return max(codes)
        if args.command == "reset-offsets":
            return _cmd_reset(admin, args, out, err)
        return _cmd_delete(admin, args.groups, out, err)
    except Exception as exc:  # noqa: BLE001
        err.write(f"Error: {type(exc).__name__}: {exc}\n")
        return EXIT_ERROR
    finally:
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
