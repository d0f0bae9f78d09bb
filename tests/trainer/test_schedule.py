from __future__ import annotations

import itertools
import math

import pytest

from x1_pretrain.core.config import OptimConfig
from x1_pretrain.trainer.schedule import Horizon, fitted_end, lr_at, planned, retarget

LAB = OptimConfig()
WSD = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="wsd", decay_fraction=0.2, decay_shape="1-sqrt")


@pytest.mark.parametrize(
    "step,expected",
    [
        (0, 3e-4 / 1000),
        (499, 3e-4 * 500 / 1000),
        (999, 3e-4),
        (1000, 3e-4),
        (1000 + 83000 // 2, 3e-5 + 0.5 * (3e-4 - 3e-5)),
        (84000, 3e-5),
        (90000, 3e-5),
    ],
)
def test_lab_schedule_values(step, expected):
    assert math.isclose(lr_at(step, LAB, 84000), expected, rel_tol=1e-12)


def test_monotone_after_warmup():
    lrs = [lr_at(s, LAB, 5000) for s in range(1000, 5001, 50)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_no_warmup_and_constant():
    assert lr_at(0, OptimConfig(warmup_steps=0), 10) == 3e-4
    assert lr_at(9, OptimConfig(warmup_steps=0, schedule="constant"), 10) == 3e-4


@pytest.mark.parametrize("shape,mid", [("linear", 0.5), ("1-sqrt", 1 - math.sqrt(0.5)), ("cosine", 0.5)])
def test_wsd_warms_up_holds_then_decays_to_min_lr_at_the_last_step(shape, mid):
    o = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="wsd", decay_fraction=0.2, decay_shape=shape)
    h = planned(100, o)
    assert (h.end_step, h.decay_start) == (100, 80)  # 20 % of the run decays
    assert lr_at(9, o, h) == 1e-3 and lr_at(50, o, h) == 1e-3 and lr_at(79, o, h) == 1e-3
    assert lr_at(99, o, h) == pytest.approx(1e-4, rel=1e-12)  # the last step (logged as step 100) is at min_lr
    assert lr_at(89, o, h) == pytest.approx(1e-4 + mid * 9e-4)  # half the decay done after step index 89
    decay = [lr_at(s, o, h) for s in range(80, 100)]
    assert all(a > b for a, b in itertools.pairwise(decay))


# --- the re-fit rule ------------------------------------------------------------------------------------
def test_before_the_decay_the_end_moves_both_ways():
    h = planned(1000, WSD)
    earlier = retarget(h, 300, 600, WSD)  # the price went up
    assert (earlier.end_step, earlier.decay_start) == (600, 480)
    later = retarget(earlier, 400, 900, WSD)  # then down again, before the decay began
    assert (later.end_step, later.decay_start) == (900, 720)
    assert lr_at(450, WSD, later) == WSD.lr  # still the stable phase: nothing jumps


def test_a_started_decay_is_never_restarted_nor_stretched_and_a_shorter_end_compresses_it():
    h = planned(1000, WSD)  # decay from 800
    more = retarget(h, 850, 2000, WSD)
    assert more == h  # more money after the decay began: keep going
    before = lr_at(849, WSD, h)
    short = retarget(h, 850, 900, WSD)  # less money: the rest of the decay is squeezed
    assert short.end_step == 900 and short.decay_start == 800 and short.anchor_step == 850
    assert short.anchor_progress == pytest.approx(h.progress(849))
    assert lr_at(850, WSD, short) < before  # continuous and still falling ...
    assert lr_at(849, WSD, short) == before  # ... the past is unchanged ...
    assert lr_at(899, WSD, short) == pytest.approx(WSD.min_lr)  # ... and min_lr at the new last step
    squeezed = [lr_at(s, WSD, short) for s in range(845, 900)]
    assert all(a > b for a, b in itertools.pairwise(squeezed))


def test_a_slowdown_or_preemption_gap_is_just_fewer_steps_that_fit():
    # the same money at a slower step time, or after a gap billed while nothing trained: fewer steps fit
    assert fitted_end(500, 300, 1000, slack=0) == 800 and fitted_end(500, 120, 1000, slack=0) == 620
    assert fitted_end(500, 10_000, 1000) == 1000  # never past --total-steps
    assert fitted_end(500, 1, 1000) == 501  # one step: an immediate, shortest decay
    assert fitted_end(500, 0, 1000) is None  # nothing fits: the lab's checkpoint-and-exit
    # the end is planned a step short of the money; the stop still waits until not one step fits
    assert fitted_end(500, 300, 1000) == 799 and fitted_end(500, 2, 1000) == 501


def test_an_immediate_decay_when_the_money_runs_out_during_the_stable_phase():
    h = retarget(planned(1000, WSD), 300, 310, WSD)
    assert h.decay_start == 300 and lr_at(309, WSD, h) == pytest.approx(WSD.min_lr)
    with pytest.raises(ValueError):
        retarget(h, 300, 300, WSD)


def test_the_horizon_round_trips_through_a_checkpoint():
    h = retarget(planned(1000, WSD), 850, 900, WSD)
    assert Horizon.from_json(h.to_json()) == h
