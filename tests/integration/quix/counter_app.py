"""A Quix Streams application with one stateful step (a count per key), run by
tests/integration/test_quix_streams.py in the separate Quix virtualenv (``.venv-quix``,
see requirements.lock here): ``python counter_app.py BOOTSTRAP IN OUT STATE_DIR GROUP N``
processes N records and exits."""

from __future__ import annotations

import sys
from typing import Any

from quixstreams import Application, State


def main() -> None:
    bootstrap, source, sink, state_dir, group, count = sys.argv[1:7]
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        state_dir=state_dir,
        auto_offset_reset="earliest",
        use_changelog_topics=True,
    )
    inp = app.topic(source, key_deserializer="str", value_deserializer="str")
    out = app.topic(sink, key_serializer="str", value_serializer="json")

    def counted(value: Any, key: Any, _ts: int, _headers: Any, state: State) -> dict[str, Any]:
        n = int(state.get("count", 0)) + 1
        state.set("count", n)
        return {"key": key, "count": n, "value": value}

    sdf = app.dataframe(inp).apply(counted, stateful=True, metadata=True)
    sdf.to_topic(out)
    app.run(count=int(count), timeout=60)


if __name__ == "__main__":
    main()
