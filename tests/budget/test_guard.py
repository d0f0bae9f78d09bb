from __future__ import annotations

import itertools
import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from x1_pretrain.budget.guard import Action, Limits, Memory, Progress, Reading, decide, parse
from x1_pretrain.budget.ledger import memory_from_json, memory_to_json
from x1_pretrain.budget.money import DEFAULT_RESERVE_MIN, Lines
from x1_pretrain.budget.source import read_source

NOW = datetime(2026, 5, 23, 15, 42, 1, tzinfo=timezone.utc)
LIMITS = Limits(cap_usd=35.0, alert_usd=30.0, sidecar_interval_min=5, stale_after_intervals=3, unknown_grace_min=60)


def snap(spent=14.2, rate=1.10, hours=12.9, projected=28.4, age_min=1.0, **extra):
    data = {
        "spent_usd": spent,
        "rate_usd_per_hr": rate,
        "hours_elapsed": hours,
        "projected_total_usd": projected,
        "last_update_utc": (NOW - timedelta(minutes=age_min)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **extra,
    }
    return parse(data)


SLOW = Progress(steps_done=1000, total_steps=2000, steps_per_hour=None)


@pytest.mark.parametrize(
    "name,reading,progress,action,spent",
    [
        ("lab example: fine", snap(), SLOW, Action.CONTINUE, 14.2),
        ("above the alert line", snap(spent=30.5, projected=33.0), SLOW, Action.ALERT, 30.5),
        ("sidecar projects over the cap", snap(spent=20.0, projected=35.5), SLOW, Action.CHECKPOINT_AND_EXIT, 20.0),
        ("spent over the cap", snap(spent=35.01, projected=36.0), SLOW, Action.EXIT_NOW, 35.01),
        ("exit-now wins over the rest", snap(spent=40.0, projected=50.0), SLOW, Action.EXIT_NOW, 40.0),
        (
            "own projection over the cap: 1000 steps left at 50/h = 20 h x $1.10 + $20",
            snap(spent=20.0, projected=25.0),
            Progress(1000, 2000, 50.0),
            Action.CHECKPOINT_AND_EXIT,
            20.0,
        ),
        (
            "own projection fits: 1000 steps at 1000/h",
            snap(spent=20.0, projected=25.0),
            Progress(1000, 2000, 1000.0),
            Action.CONTINUE,
            20.0,
        ),
        (
            "final checkpoint time counts",
            snap(spent=33.0, projected=33.0, rate=1.0),
            Progress(2000, 2000, 10.0, final_checkpoint_s=3 * 3600),
            Action.CHECKPOINT_AND_EXIT,
            33.0,
        ),
    ],
)
def test_rules(name, reading, progress, action, spent):
    decision, _ = decide(reading, LIMITS, NOW, progress, Memory())
    assert decision.action == action, name
    # every reading is aged: a minute old at its rate
    assert decision.spent_usd == pytest.approx(spent + reading.snapshot.rate_usd_per_hr / 60)


def test_larger_projection_wins_and_both_are_reported():
    d, _ = decide(snap(spent=20.0, projected=30.0), LIMITS, NOW, Progress(1000, 2000, 500.0), Memory())
    spent = 20.0 + 1.10 / 60
    # the planner's terms: spend + 2 h + the reserve at the rate + the fixed lines the reading does not carry
    assert d.own_projection_usd == pytest.approx(spent + 1.10 * (2 + DEFAULT_RESERVE_MIN / 60) + Lines().fixed)
    assert d.file_projection_usd == pytest.approx(30.0 + 1.10 / 60)
    assert d.projected_usd == pytest.approx(30.0 + 1.10 / 60)


def test_alert_fires_once_per_crossing():
    mem = Memory()
    d1, mem = decide(snap(spent=30.5, projected=33), LIMITS, NOW, SLOW, mem)
    d2, mem = decide(snap(spent=31.0, projected=33), LIMITS, NOW, SLOW, mem)
    assert d1.action == Action.ALERT and len(d1.alerts) == 1 and "30.52" in d1.alerts[0]
    assert d2.action == Action.CONTINUE and d2.alerts == ()


@pytest.mark.parametrize(
    "bad,needle",
    [
        (Reading(None, "x does not exist (is the budget sidecar running?)"), "does not exist"),
        (parse({"spent_usd": 1}), "lacks rate_usd_per_hr"),
        (parse([]), "not a JSON object"),
        (
            parse(
                {
                    "spent_usd": -1,
                    "rate_usd_per_hr": 1,
                    "hours_elapsed": 1,
                    "projected_total_usd": 1,
                    "last_update_utc": "2026-05-23T15:00:00Z",
                }
            ),
            "negative",
        ),
        (
            parse(
                {
                    "spent_usd": math.nan,
                    "rate_usd_per_hr": 1,
                    "hours_elapsed": 1,
                    "projected_total_usd": 1,
                    "last_update_utc": "2026-05-23T15:00:00Z",
                }
            ),
            "not a finite number",
        ),
        (
            parse(
                {
                    "spent_usd": math.inf,
                    "rate_usd_per_hr": 1,
                    "hours_elapsed": 1,
                    "projected_total_usd": 1,
                    "last_update_utc": "2026-05-23T15:00:00Z",
                }
            ),
            "not a finite number",
        ),
        (
            parse(
                {
                    "spent_usd": "12",
                    "rate_usd_per_hr": 1,
                    "hours_elapsed": 1,
                    "projected_total_usd": 1,
                    "last_update_utc": "2026-05-23T15:00:00Z",
                }
            ),
            "not a number",
        ),
        (
            parse(
                {
                    "spent_usd": 1,
                    "rate_usd_per_hr": 1,
                    "hours_elapsed": 1,
                    "projected_total_usd": 1,
                    "last_update_utc": "yesterday",
                }
            ),
            "not an ISO-8601 time",
        ),
    ],
)
def test_faults_extrapolate_the_last_good_reading_and_alert_once(bad, needle):
    _, mem = decide(snap(spent=10.0, rate=2.0, age_min=0), LIMITS, NOW, SLOW, Memory())
    later = NOW + timedelta(minutes=30)
    d1, mem = decide(bad, LIMITS, later, SLOW, mem)
    d2, mem = decide(bad, LIMITS, later, SLOW, mem)
    assert d1.action == Action.ALERT and needle in d1.warnings[0]
    assert d1.spent_usd == pytest.approx(10.0 + 2.0 * 0.5)  # extrapolated at the last rate
    assert d2.action == Action.CONTINUE and d2.alerts == () and d2.warnings  # still warned, not re-alerted


def test_future_timestamp_is_a_fault():
    d, _ = decide(snap(age_min=-30), LIMITS, NOW, SLOW, Memory())
    assert "in the future" in d.warnings[0]
    assert d.action == Action.ALERT and d.spent_usd is None  # no earlier reading: spend unknown, within grace


def test_stale_reading_is_extrapolated_and_alerted_once():
    d1, mem = decide(snap(spent=10.0, rate=1.2, age_min=20), LIMITS, NOW, SLOW, Memory())
    assert d1.action == Action.ALERT and "stale" in d1.alerts[0]
    assert d1.spent_usd == pytest.approx(10.0 + 1.2 * 20 / 60)
    d2, mem = decide(snap(spent=10.0, rate=1.2, age_min=25), LIMITS, NOW, SLOW, mem)
    assert d2.action == Action.CONTINUE
    d3, mem = decide(snap(spent=11.0, age_min=1), LIMITS, NOW, SLOW, mem)  # fresh again: re-armed
    d4, mem = decide(snap(spent=11.0, age_min=20), LIMITS, NOW, SLOW, mem)
    assert d3.action == Action.CONTINUE and d4.action == Action.ALERT


def test_stale_extrapolation_can_cross_the_cap():
    d, _ = decide(snap(spent=34.0, rate=2.0, projected=34.5, age_min=45), LIMITS, NOW, SLOW, Memory())
    assert d.action == Action.EXIT_NOW


def test_unknown_spend_stops_with_a_checkpoint_after_the_grace_period():
    missing = Reading(None, "budget.json does not exist")
    d1, mem = decide(missing, LIMITS, NOW, SLOW, Memory())
    assert d1.action == Action.ALERT and d1.spent_usd is None
    d2, mem = decide(missing, LIMITS, NOW + timedelta(minutes=59), SLOW, mem)
    assert d2.action == Action.CONTINUE
    d3, mem = decide(missing, LIMITS, NOW + timedelta(minutes=61), SLOW, mem)
    assert d3.action == Action.CHECKPOINT_AND_EXIT and "unknown spend is not safe spend" in d3.reason
    # a last reading older than the grace period is as good as none
    d4, _ = decide(snap(age_min=90), LIMITS, NOW, SLOW, Memory())
    assert d4.action == Action.CHECKPOINT_AND_EXIT


def test_read_source_variants(tmp_path):
    p = tmp_path / "budget.json"
    assert "does not exist" in read_source(str(p)).problem
    p.write_text("{not json")
    assert "not valid JSON" in read_source(p.as_uri()).problem
    p.write_text(
        json.dumps(
            {
                "spent_usd": 1.0,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 1,
                "projected_total_usd": 2,
                "last_update_utc": "2026-05-23T15:42:01Z",
            }
        )
    )
    r = read_source(str(p))
    assert r.problem is None and r.snapshot.rate_usd_per_hr == 1.1
    assert r.snapshot.last_update_utc == datetime(2026, 5, 23, 15, 42, 1, tzinfo=timezone.utc)


# --- the ledger's rules: spend never decreases, readings are aged, faults are flagged ----------------------
def _at(minutes: float):
    return NOW + timedelta(minutes=minutes)


def snap_at(minutes: float, spent: float, rate: float = 1.10, projected: float | None = None, **extra):
    t = _at(minutes).strftime("%Y-%m-%dT%H:%M:%SZ")
    return parse(
        {
            "spent_usd": spent,
            "rate_usd_per_hr": rate,
            "hours_elapsed": 1.0,
            "projected_total_usd": spent if projected is None else projected,
            "last_update_utc": t,
            **extra,
        }
    )


def test_a_falling_reading_is_a_warning_and_an_alert_never_a_lower_spend():
    _, mem = decide(snap_at(0, 34.0), LIMITS, _at(0), SLOW, Memory())
    d2, mem = decide(snap_at(5, 2.0), LIMITS, _at(5), SLOW, mem)  # a sidecar restarted from zero
    assert d2.spent_usd == pytest.approx(34.0 + 1.10 * 5 / 60)  # the ledger's spend, aged
    assert d2.action == Action.ALERT and "below" in d2.alerts[0] and any("keeping" in w for w in d2.warnings)
    d3, mem = decide(snap_at(10, 2.1), LIMITS, _at(10), SLOW, mem)
    assert d3.alerts == () and d3.spent_usd == pytest.approx(34.0 + 1.10 * 10 / 60)  # alerted once, still kept


def test_a_price_change_never_rewrites_the_past():
    # 20 h at $1.40, then the sidecar's old arithmetic (today's rate x all hours) says $15.80
    _, mem = decide(snap_at(0, 28.0, rate=1.40), LIMITS, _at(0), SLOW, Memory())
    d, mem = decide(snap_at(5, 15.80, rate=0.79), LIMITS, _at(5), SLOW, mem)
    assert d.spent_usd == pytest.approx(28.0 + 1.40 * 5 / 60)
    # from now on the spend ages at the new rate
    d2, _ = decide(Reading(None, "budget.json does not exist"), LIMITS, _at(65), SLOW, mem)
    assert d2.spent_usd == pytest.approx(d.spent_usd + 0.79)


def test_a_rate_of_zero_is_flagged_and_never_ages_the_spend():
    _, mem = decide(snap_at(0, 10.0, rate=1.10), LIMITS, _at(0), SLOW, Memory())
    d, mem = decide(snap_at(30, 10.5, rate=0.0), LIMITS, _at(60), SLOW, mem)
    assert any("rate_usd_per_hr is 0" in a for a in d.alerts)
    # aged at the last trusted rate (1.10) for its 30 min age, and never below the ledger's 10 + 1.10 x 1 h
    assert d.spent_usd == pytest.approx(max(10.5 + 1.10 * 0.5, 10.0 + 1.10))


def test_a_rate_far_from_the_launch_rate_and_an_impossible_jump_are_flagged():
    _, mem = decide(snap_at(0, 5.0, rate=1.10), LIMITS, _at(0), SLOW, Memory())
    d, mem = decide(snap_at(5, 5.1, rate=3.50), LIMITS, _at(5), SLOW, mem)
    assert any("far from the launch rate $1.10/h" in a for a in d.alerts)
    d2, _ = decide(snap_at(10, 20.0, rate=1.10), LIMITS, _at(10), SLOW, mem)  # +$15 in 5 min
    assert any("jumped by $14.90" in a for a in d2.alerts) and d2.spent_usd == pytest.approx(20.0)


def test_spend_is_non_decreasing_over_any_sequence_of_readings():
    readings = [
        snap_at(0, 3.0),
        snap_at(5, 3.1),
        Reading(None, "timeout"),
        snap_at(15, 1.0),
        snap_at(20, 3.4),
        snap_at(25, 3.45, rate=0.0),
        snap_at(-30, 2.0),
        snap_at(40, 3.9),
    ]
    mem, seen = Memory(), []
    for i, r in enumerate(readings):
        d, mem = decide(r, LIMITS, _at(5 * i), SLOW, mem)
        seen.append(d.spent_usd)
    assert all(b >= a for a, b in itertools.pairwise(seen))


def test_the_unknown_grace_is_counted_across_processes_through_the_ledger():
    # Four restarts, each with a fresh process whose memory comes from the ledger's JSON: the grace (60 min)
    # starts at the first check without a reading, not at each process's start.
    missing = Reading(None, "budget.json does not exist")
    mem, actions = Memory(), []
    for minutes in (0, 20, 40, 61):
        d, mem = decide(missing, LIMITS, _at(minutes), SLOW, mem)
        mem = memory_from_json(memory_to_json(mem))  # what the next process reads back
        actions.append(d.action)
    assert actions[-1] == Action.CHECKPOINT_AND_EXIT and Action.CHECKPOINT_AND_EXIT not in actions[:-1]
    assert "alert" in {a.value for a in actions[:1]}


def test_the_memory_round_trips_through_json_exactly():
    _, mem = decide(
        snap_at(0, 31.0, rate=1.2, fixed_usd={"disk_usd": 2.0, "egress_usd": 1.0}), LIMITS, _at(0), SLOW, Memory()
    )
    back = memory_from_json(json.loads(json.dumps(memory_to_json(mem))))
    assert back == mem and back.last_good.fixed_usd == 3.0 and "alert_line" in back.alerted


def test_fixed_lines_are_added_to_projections_only_when_the_reading_lacks_them():
    prog = Progress(1000, 2000, 500.0)
    old, _ = decide(snap(spent=20.0, projected=20.0), LIMITS, NOW, prog, Memory())
    new, _ = decide(
        snap(spent=23.0, projected=23.0, fixed_usd={"disk_usd": 2.0, "egress_usd": 1.0}), LIMITS, NOW, prog, Memory()
    )
    assert new.own_projection_usd == pytest.approx(old.own_projection_usd)


def _on(machine, spent, at=NOW, projected=None):
    """machine's budget.json read at ``at``, written a minute before; $3 of fixed lines in its spent_usd."""
    return parse(
        {
            "spent_usd": spent,
            "rate_usd_per_hr": 1.10,
            "hours_elapsed": 1.0,
            "projected_total_usd": projected if projected is not None else spent + 5,
            "last_update_utc": (at - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "provider": "runpod",
            "resource_id": machine,
            "fixed_usd": {"disk_usd": 2.0, "egress_usd": 1.0},
        }
    )


def test_spend_across_two_machines_is_their_sum_with_the_fixed_lines_once():
    """A lost spot instance: machine A billed $20 of compute (+$3 of fixed lines), then the run resumes on B
    whose sidecar counts only B's own bill. The total the cap guards is A's compute + B's reading."""
    mem = Memory()
    d, mem = decide(_on("pod-a", 23.0), LIMITS, NOW, SLOW, mem)
    assert mem.machine == "runpod:pod-a" and d.spent_usd == pytest.approx(23.0 + 1.10 / 60)
    # the ledger carries the memory to the new machine (through the mirror); B's first reading: $1 + $3 fixed
    mem = memory_from_json(json.loads(json.dumps(memory_to_json(mem))))
    later = NOW + timedelta(hours=1)
    d, mem = decide(_on("pod-b", 4.0, later), LIMITS, later, SLOW, mem)
    a_compute = 23.0 + 1.10 / 60 - 3.0
    assert d.spent_usd == pytest.approx(a_compute + 4.0 + 1.10 / 60, abs=1e-4)  # bills kept to 1e-4 dollars
    assert mem.machine == "runpod:pod-b" and mem.machines == (("runpod:pod-a", round(a_compute, 4)),)
    assert any("another machine" in w for w in d.warnings)
    # the cap holds for the sum: B alone ($14 + $3) is far below $35, A + B is above
    d, mem = decide(_on("pod-b", 17.0, later + timedelta(hours=9)), LIMITS, later + timedelta(hours=9), SLOW, mem)
    assert d.action == Action.EXIT_NOW and d.spent_usd > LIMITS.cap_usd
    assert 17.0 + 1.10 / 60 < LIMITS.cap_usd < d.spent_usd


def test_after_a_move_the_guard_projects_from_the_steps_left_not_the_sidecars_planned_hours():
    """B's sidecar projects its planned 24 h from B's own start ($30): added to A's compute that would count A's
    hours twice. After a move the guard's own projection (steps left at the measured speed) decides."""
    mem = Memory()
    _, mem = decide(_on("pod-a", 13.0), LIMITS, NOW, SLOW, mem)
    at = NOW + timedelta(hours=2)
    d, mem = decide(_on("pod-b", 5.0, at, projected=30.0), LIMITS, at, Progress(1000, 2000, 500.0), mem)
    spent = (13.0 + 1.10 / 60 - 3.0) + 5.0 + 1.10 / 60
    assert d.file_projection_usd is None and d.action == Action.CONTINUE
    assert d.projected_usd == pytest.approx(spent + 1.10 * (2 + DEFAULT_RESERVE_MIN / 60), abs=0.01)
    d, _ = decide(_on("pod-b", 5.0, at), LIMITS, at, Progress(1000, 2000, 50.0), mem)  # 20 h left: over
    assert d.action == Action.CHECKPOINT_AND_EXIT
    back = memory_from_json(memory_to_json(mem))
    assert (back.machine, back.earlier_usd, back.machines) == (mem.machine, mem.earlier_usd, mem.machines)


def test_back_on_a_machine_seen_before_its_bill_is_not_counted_twice():
    """A -> B -> A (a stopped pod resumed with its id and its sidecar's state): A's reading carries both of A's
    stints, so only B's bill is added to it."""
    mem = Memory()
    _, mem = decide(_on("pod-a", 13.0), LIMITS, NOW, SLOW, mem)
    at = NOW + timedelta(hours=2)
    _, mem = decide(_on("pod-b", 7.0, at), LIMITS, at, SLOW, mem)
    at2 = at + timedelta(hours=1)
    d, mem = decide(_on("pod-a", 14.2, at2), LIMITS, at2, SLOW, mem)
    b_compute = 7.0 + 1.10 / 60 - 3.0
    assert dict(mem.machines) == {"runpod:pod-b": pytest.approx(b_compute, abs=1e-4)}
    assert d.spent_usd == pytest.approx(b_compute + 14.2 + 1.10 / 60, abs=1e-3)


def test_readings_of_one_machine_never_count_twice_and_old_sidecars_stay_one_machine():
    mem = Memory()
    for minutes in (0, 5, 10):  # the same instance, its sidecar restarted: still one machine
        at = NOW + timedelta(minutes=minutes)
        d, mem = decide(_on("pod-a", 10.0 + minutes / 60, at), LIMITS, at, SLOW, mem)
    assert mem.machines == () and d.spent_usd < 11.0
    d, mem2 = decide(snap(spent=12.0, age_min=-14), LIMITS, NOW + timedelta(minutes=15), SLOW, mem)  # no machine
    assert mem2.machines == () and mem2.machine == "runpod:pod-a"
