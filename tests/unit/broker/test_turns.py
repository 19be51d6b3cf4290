"""``broker.turns.TurnBudget``: a long loop on the event loop asks for a turn after a
number of items or once it has held the loop its time budget, whichever comes first."""

from __future__ import annotations

import time

from broker.turns import TurnBudget


def _hold(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_turn_every_so_many_cheap_items() -> None:
    budget = TurnBudget(items=4, budget_s=3600)
    assert [budget.due() for _ in range(12)] == [False, False, False, True] * 3


def test_a_turn_once_the_budget_is_spent_however_few_the_items() -> None:
    budget = TurnBudget(items=1000, budget_s=0.002)
    assert budget.due() is False
    _hold(0.003)  # one dear item
    assert budget.due() is True
    assert budget.due() is False  # counted afresh from the turn
    _hold(0.003)
    assert budget.due() is True
