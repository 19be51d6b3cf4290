"""A real local store that counts its GETs (whole and ranged), for the read-path tests
(tests/unit/broker/test_segment_loader.py, test_segment_windows.py)."""

from __future__ import annotations

from segments.local_store import MAP_MIN, LocalStore
from segments.store import Buffer


class CountingStore(LocalStore):
    def __init__(self, root: str, ranged: bool = False) -> None:
        super().__init__(root)
        self.parallel_ranged_gets = ranged
        self.gets: list[tuple[str, int | None, int | None]] = []

    async def get(
        self, key: str, start: int | None = None, end: int | None = None,
        if_match: str | None = None,
    ) -> bytes:  # fmt: skip
        self.gets.append((key, start, end))
        return await super().get(key, start, end, if_match)

    async def get_buffer(
        self, key: str, start: int | None = None, end: int | None = None,
        if_match: str | None = None,
    ) -> Buffer:  # fmt: skip
        """The read path's GET (a mapping of the file when large), counted likewise."""
        if start is not None and end is not None and end - start < MAP_MIN:
            return await self.get(key, start, end, if_match)  # LocalStore's does the same
        self.gets.append((key, start, end))
        return await super().get_buffer(key, start, end, if_match)
