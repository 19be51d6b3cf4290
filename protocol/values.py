"""``@value``: the small immutable records made per batch and per segment on the produce
path (a batch header, a segment's header and footer, a manifest entry).

To the type checker a ``@value`` class is a frozen dataclass: mypy reports any
assignment to a field. At run time it is a plain slotted dataclass. A frozen dataclass
sets every field in ``__init__`` through ``object.__setattr__``, which made the 13-field
``BatchHeader`` cost 2.9 µs to build against 0.34 µs. With a few hundred batches per MB
(a Java client producing to 1,000 partitions), such constructors were 15 % of the
broker's event loop (docs/benchmarks.md, "Round 14"). Instances compare and hash by
value, as frozen ones do; nothing assigns to them (mypy checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def value(cls: type[T]) -> type[T]:
    """A frozen dataclass to mypy, a slotted, hashable, mutable-in-principle one at run
    time (see the module doc)."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
