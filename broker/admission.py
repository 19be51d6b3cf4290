"""Admission control: how many request bytes the broker holds, and who must wait.

Two budgets, both in bytes, both enforced by making connections stop reading (TCP then
pushes back on the client) rather than by queueing without bound:

- **In flight**: the bytes of frames read and not yet answered, per connection
  (``--connection-inflight-bytes``) and per broker (``--broker-inflight-bytes``). Past
  either limit the connection pauses; it resumes when the answers have gone out.
- **Partial frames**: the announced sizes of frames whose bytes are still arriving, per
  broker (``--queued-max-request-bytes``, like Kafka's ``queued.max.request.bytes``). A
  frame is reserved when its length is read; one that finds no room waits, unread, in
  arrival order, until others complete. A frame larger than the whole budget proceeds
  when nothing else is reserved, so it cannot starve.

A connection is anything with the small interface below (``broker.connection.Connection``
in the broker, a fake in tests).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol


class Paused(Protocol):
    """What in-flight accounting needs of a connection."""

    inflight: int

    def pause(self) -> None: ...
    def resume(self) -> None: ...


class FrameWaiter(Protocol):
    """What the partial-frame budget needs of a connection."""

    reserved: int
    waiting_for_memory: int

    def memory_granted(self) -> None: ...


class Admission:
    def __init__(
        self, connection_inflight: int, broker_inflight: int, queued_frame_bytes: int
    ) -> None:
        self.connection_inflight = connection_inflight
        self.broker_inflight = broker_inflight
        self.queued_frame_bytes = queued_frame_bytes
        self.inflight = 0  # bytes read and not yet answered, over all connections
        self.frame_bytes = 0  # announced bytes of partially received frames (reserved)
        self._paused: set[Paused] = set()
        self._frame_waiters: deque[FrameWaiter] = deque()

    # -- in flight ----------------------------------------------------------------------
    def acquire(self, conn: Paused, nbytes: int) -> None:
        """``conn`` read a frame of ``nbytes`` (already added to ``conn.inflight``)."""
        self.inflight += nbytes
        if conn.inflight > self.connection_inflight or self.inflight > self.broker_inflight:
            self._paused.add(conn)
            conn.pause()

    def release(self, conn: Paused, nbytes: int) -> None:
        """``nbytes`` of ``conn`` were answered (already taken off ``conn.inflight``)."""
        self.inflight -= nbytes
        if self.inflight > self.broker_inflight:
            return
        for c in list(self._paused):
            if c.inflight <= self.connection_inflight:
                self._paused.discard(c)
                c.resume()

    def forget(self, conn: Paused) -> None:
        """``conn`` closed."""
        self._paused.discard(conn)

    # -- partial frames -------------------------------------------------------------------
    def reserve_frame(self, conn: FrameWaiter, size: int) -> bool:
        """Reserve ``size`` bytes for the frame ``conn`` starts receiving. False: no room,
        ``conn`` waits (FIFO) and gets ``memory_granted()`` later."""
        if self._frame_waiters or not self._fits(size):
            self._frame_waiters.append(conn)
            return False
        self._grant(conn, size)
        return True

    def _fits(self, size: int) -> bool:
        return self.frame_bytes == 0 or self.frame_bytes + size <= self.queued_frame_bytes

    def _grant(self, conn: FrameWaiter, size: int) -> None:
        conn.reserved = size
        self.frame_bytes += size

    def release_frame(self, conn: FrameWaiter) -> None:
        """``conn``'s frame completed or was dropped: return its reservation, let waiters in."""
        if conn.reserved:
            self.frame_bytes -= conn.reserved
            conn.reserved = 0
        elif conn in self._frame_waiters:
            self._frame_waiters.remove(conn)
        while self._frame_waiters:
            nxt = self._frame_waiters[0]
            if nxt.waiting_for_memory == 0:  # closed meanwhile
                self._frame_waiters.popleft()
                continue
            if not self._fits(nxt.waiting_for_memory):
                break
            self._frame_waiters.popleft()
            self._grant(nxt, nxt.waiting_for_memory)
            nxt.memory_granted()
