"""broker.admission: in-flight bytes per connection and per broker, and the partial-frame
budget, with stand-in connections (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from broker.admission import Admission


@dataclass(eq=False)
class Conn:
    inflight: int = 0
    paused: bool = False
    reserved: int = 0
    waiting_for_memory: int = 0
    granted: int = 0

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def memory_granted(self) -> None:
        self.granted += 1
        self.waiting_for_memory = 0


def read(adm: Admission, conn: Conn, n: int) -> None:
    conn.inflight += n
    adm.acquire(conn, n)


def answered(adm: Admission, conn: Conn, n: int) -> None:
    conn.inflight -= n
    adm.release(conn, n)


def test_connection_limit_pauses_only_that_connection() -> None:
    adm = Admission(connection_inflight=100, broker_inflight=1000, queued_frame_bytes=1 << 20)
    a, b = Conn(), Conn()
    read(adm, a, 150)
    read(adm, b, 50)
    assert a.paused and not b.paused and adm.inflight == 200
    answered(adm, a, 100)
    assert not a.paused and adm.inflight == 100


def test_broker_limit_pauses_everyone_over_it_and_resumes_them_together() -> None:
    adm = Admission(connection_inflight=1000, broker_inflight=300, queued_frame_bytes=1 << 20)
    conns = [Conn() for _ in range(4)]
    for c in conns:
        read(adm, c, 100)
    assert [c.paused for c in conns] == [False, False, False, True]
    read(adm, conns[0], 10)
    assert conns[0].paused
    answered(adm, conns[1], 100)  # 310 -> still over 300
    assert conns[3].paused and conns[0].paused
    answered(adm, conns[2], 100)
    assert not any(c.paused for c in conns) and adm.inflight == 210


def test_frame_budget_is_fifo_and_lets_a_huge_frame_through_alone() -> None:
    adm = Admission(connection_inflight=1 << 30, broker_inflight=1 << 30, queued_frame_bytes=100)
    a, b, c = Conn(), Conn(), Conn()
    assert adm.reserve_frame(a, 60)
    b.waiting_for_memory = 60
    assert not adm.reserve_frame(b, 60)  # 120 > 100: waits
    c.waiting_for_memory = 10
    assert not adm.reserve_frame(c, 10)  # would fit, but b is first
    adm.release_frame(a)
    assert b.granted == 1 and c.granted == 1 and adm.frame_bytes == 70
    adm.release_frame(b)
    adm.release_frame(c)
    assert adm.frame_bytes == 0
    huge = Conn()
    assert adm.reserve_frame(huge, 10_000)  # bigger than the budget, nothing else reserved
    adm.release_frame(huge)
    assert adm.frame_bytes == 0


def test_a_closed_waiter_is_skipped() -> None:
    adm = Admission(connection_inflight=1 << 30, broker_inflight=1 << 30, queued_frame_bytes=100)
    a, gone, b = Conn(), Conn(), Conn()
    assert adm.reserve_frame(a, 90)
    gone.waiting_for_memory = 50
    assert not adm.reserve_frame(gone, 50)
    b.waiting_for_memory = 20
    assert not adm.reserve_frame(b, 20)
    gone.waiting_for_memory = 0  # closed meanwhile
    adm.release_frame(a)
    assert gone.granted == 0 and b.granted == 1 and adm.frame_bytes == 20
