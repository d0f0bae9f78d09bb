"""The one planner's arithmetic (budget/money.py): what a run costs in all, and how many steps fit."""

from __future__ import annotations

import pytest

from x1_pretrain.budget.money import Lines, Money, steps_that_fit

NONE = Lines(egress_usd=0, disk_usd=0, buffer_usd=0)  # no fixed lines, no buffer


def test_the_whole_bill_counts_fixed_lines_reserve_set_up_and_buffer():
    m = Money(
        35.0,
        1.10,
        lines=Lines(egress_usd=1.0, disk_usd=2.0, buffer_usd=5.0),
        spent_usd=4.0,
        setup_hours=1.0,
        reserve_min=30.0,
    )
    # spent + fixed + rate x (training + set-up + reserve) + buffer
    assert m.total_usd(10.0) == pytest.approx(4.0 + 3.0 + 1.10 * (10 + 1 + 0.5) + 5.0)
    assert m.total_usd(10.0, buffer=False) == pytest.approx(m.total_usd(10.0) - 5.0)
    assert Money(35.0, 1.10, spent_usd=4.0, fixed_in_spent=True).total_usd(0, buffer=False) == pytest.approx(
        4.0 + 1.10 * 10 / 60
    )  # the sidecar's spend already carries the fixed lines


def test_steps_that_fit_are_what_is_left_over_the_step_time():
    m = Money(35.0, 1.10, lines=NONE, spent_usd=2.0, reserve_min=0.0)
    assert steps_that_fit(m, 2.0, buffer=False) == 54_000  # $33 at $1.10/h is 30 h of 2 s steps (no float loss)
    assert steps_that_fit(m, 2.0, max_training_hours=1.0, buffer=False) == 1800  # the time window binds
    assert steps_that_fit(Money(35.0, 1.10, spent_usd=40.0), 2.0) == 0  # over the cap: nothing fits


def test_the_step_in_flight_counts_at_most_one_step():
    m = Money(10.0, 3600.0, lines=NONE, spent_usd=10.0 - 2.5, reserve_min=0.0)  # $1 a second, 2.5 s left
    assert steps_that_fit(m, 1.0, buffer=False) == 2
    assert steps_that_fit(m, 1.0, buffer=False, paid_s=0.7) == 3  # 0.7 s of that step are already paid
    assert steps_that_fit(m, 1.0, buffer=False, paid_s=50.0) == 3  # a hung step gets no more than one step


def test_no_limit_at_all_is_an_error():
    with pytest.raises(ValueError, match="no limit"):
        steps_that_fit(Money(35.0, 0.0), 1.0)
