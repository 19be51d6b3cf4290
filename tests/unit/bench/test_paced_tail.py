"""bench.paced_tail.stalls: runs of slow deliveries, grouped by send time."""

from __future__ import annotations

from bench.paced_tail import stalls


def test_slow_messages_sent_close_together_are_one_stall() -> None:
    fast, slow = 0.004, 0.022
    res = [(0.000, fast), (0.0005, slow), (0.001, slow), (0.0015, slow), (0.002, fast)]
    res += [(0.5, slow)]  # alone, later: a stall of its own
    res += [(1.0 + i * 0.0005, slow) for i in range(30)]  # a long one
    res.reverse()  # the order of the callbacks does not matter: sorted by send time
    assert stalls(res) == [3, 1, 30]


def test_no_slow_message_no_stall() -> None:
    assert stalls([(i * 0.001, 0.005) for i in range(100)]) == []
    assert stalls([]) == []
