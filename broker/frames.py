"""Partial request frames of a connection (issue 16): buffers that grow as their bytes
arrive, the broker-wide reservation of announced bytes, and the read deadline.

A mixin of :class:`broker.connection.Connection`, which owns the state declared below; see
that module's documentation for the rules.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger(__name__)

# a frame's buffer starts at most this big, then doubles: 1 MiB holds a whole request of
# librdkafka's and the Java client's default maximum (1 MB), so it never grows and is
# never copied (announced bytes are reserved against the broker budget before this)
FIRST_CHUNK = 1024 * 1024
_ZEROS = bytes(1 << 20)  # growth source for frame buffers (no temporary per extension)
_ZEROS_VIEW = memoryview(_ZEROS)


class PartialFrames:
    # state of the Connection this is mixed into
    broker: Broker
    peer: str
    _scratch: bytearray
    _scratch_view: memoryview
    _filled: int
    _frame: bytearray | None
    _frame_pos: int
    _frame_size: int
    _read_timer: asyncio.TimerHandle | None
    _closed: bool
    reserved: int  # bytes of the frame being received, reserved against the broker budget
    waiting_for_memory: int  # a frame length that found no room (0: none)

    def close(self) -> None:
        raise NotImplementedError

    def memory_granted(self) -> None:
        raise NotImplementedError

    def _reading_stopped(self) -> bool:
        raise NotImplementedError

    def _grow(self, frame: bytearray) -> bytearray:
        """Double the partial frame's buffer (never past its announced size)."""
        extra = min(self._frame_size, max(2 * len(frame), FIRST_CHUNK)) - len(frame)
        try:
            while extra > 0:
                step = min(extra, len(_ZEROS))
                frame += _ZEROS_VIEW[:step]
                extra -= step
        except BufferError:  # still exported somewhere: move it to a new buffer
            grown = bytearray(len(frame) + extra)
            grown[: self._frame_pos] = frame[: self._frame_pos]
            self._frame = frame = grown
        return frame

    def _start_frame(self, size: int, head: memoryview) -> None:
        have = len(head)
        frame = bytearray(min(size, max(2 * have, FIRST_CHUNK)))
        frame[:have] = head
        self._frame, self._frame_pos, self._frame_size = frame, have, size
        self._arm_read_timer()

    def _frame_done(self) -> None:
        self._cancel_read_timer()
        self._frame_size = 0
        self.broker.admission.release_frame(self)

    def _drop_partial(self) -> None:
        self._cancel_read_timer()
        self._frame = None
        self.waiting_for_memory = 0
        self.broker.admission.release_frame(self)

    # -- read deadline ------------------------------------------------------------------
    def _arm_read_timer(self) -> None:
        self._cancel_read_timer()
        timeout = self.broker.config.request_read_timeout_ms
        if timeout > 0 and self._partial() and not self._reading_stopped():
            loop = asyncio.get_running_loop()
            self._read_timer = loop.call_later(timeout / 1000, self._read_timed_out)

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _partial(self) -> bool:
        """Part of a frame (or of its length) has arrived, the rest has not."""
        return self._frame is not None or self._filled > 0

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self._partial() or self._closed:
            return
        if self._frame is not None:
            size = self._frame_size
        else:
            size = int.from_bytes(self._scratch[:4], "big") if self._filled >= 4 else -1
        got = self._frame_pos if self._frame is not None else self._filled
        log.warning(
            "closing %s: frame incomplete (announced %d bytes, %d received) after %d ms",
            self.peer,
            size,
            got,
            self.broker.config.request_read_timeout_ms,
        )
        self.close()
