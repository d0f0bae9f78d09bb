from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pytest

from x1_pretrain.budget.guard import Action, Limits, Memory, Progress, Reading, decide, parse, read_source

NOW = datetime(2026, 5, 23, 15, 42, 1, tzinfo=timezone.utc)
LIMITS = Limits(cap_usd=35.0, alert_usd=30.0, sidecar_interval_min=5, stale_after_intervals=3, unknown_grace_min=60)


def snap(spent=14.2, rate=1.10, hours=12.9, projected=28.4, age_min=1.0, **extra):
    data = {"spent_usd": spent, "rate_usd_per_hr": rate, "hours_elapsed": hours, "projected_total_usd": projected,
            "last_update_utc": (NOW - timedelta(minutes=age_min)).strftime("%Y-%m-%dT%H:%M:%SZ"), **extra}
    return parse(data)


SLOW = Progress(steps_done=1000, total_steps=2000, steps_per_hour=None)


@pytest.mark.parametrize("name,reading,progress,action,spent", [
    ("lab example: fine", snap(), SLOW, Action.CONTINUE, 14.2),
    ("above the alert line", snap(spent=30.5, projected=33.0), SLOW, Action.ALERT, 30.5),
    ("sidecar projects over the cap", snap(spent=20.0, projected=35.5), SLOW, Action.CHECKPOINT_AND_EXIT, 20.0),
    ("spent over the cap", snap(spent=35.01, projected=36.0), SLOW, Action.EXIT_NOW, 35.01),
    ("exit-now wins over the rest", snap(spent=40.0, projected=50.0), SLOW, Action.EXIT_NOW, 40.0),
    ("own projection over the cap: 1000 steps left at 50/h = 20 h x $1.10 + $20",
     snap(spent=20.0, projected=25.0), Progress(1000, 2000, 50.0), Action.CHECKPOINT_AND_EXIT, 20.0),
    ("own projection fits: 1000 steps at 1000/h", snap(spent=20.0, projected=25.0), Progress(1000, 2000, 1000.0),
     Action.CONTINUE, 20.0),
    ("final checkpoint time counts", snap(spent=33.0, projected=33.0, rate=1.0),
     Progress(2000, 2000, 10.0, final_checkpoint_s=3 * 3600), Action.CHECKPOINT_AND_EXIT, 33.0),
])
def test_rules(name, reading, progress, action, spent):
    decision, _ = decide(reading, LIMITS, NOW, progress, Memory())
    assert decision.action == action, name
    assert decision.spent_usd == pytest.approx(spent)


def test_larger_projection_wins_and_both_are_reported():
    d, _ = decide(snap(spent=20.0, projected=30.0), LIMITS, NOW, Progress(1000, 2000, 500.0), Memory())
    assert d.own_projection_usd == pytest.approx(20.0 + 1.10 * 2)
    assert d.file_projection_usd == pytest.approx(30.0)
    assert d.projected_usd == pytest.approx(30.0)


def test_alert_fires_once_per_crossing():
    mem = Memory()
    d1, mem = decide(snap(spent=30.5, projected=33), LIMITS, NOW, SLOW, mem)
    d2, mem = decide(snap(spent=31.0, projected=33), LIMITS, NOW, SLOW, mem)
    assert d1.action == Action.ALERT and len(d1.alerts) == 1 and "30.50" in d1.alerts[0]
    assert d2.action == Action.CONTINUE and d2.alerts == ()


@pytest.mark.parametrize("bad,needle", [
    (Reading(None, "x does not exist (is the budget sidecar running?)"), "does not exist"),
    (parse({"spent_usd": 1}), "lacks rate_usd_per_hr"),
    (parse([]), "not a JSON object"),
    (parse({"spent_usd": -1, "rate_usd_per_hr": 1, "hours_elapsed": 1, "projected_total_usd": 1,
            "last_update_utc": "2026-05-23T15:00:00Z"}), "negative"),
    (parse({"spent_usd": math.nan, "rate_usd_per_hr": 1, "hours_elapsed": 1, "projected_total_usd": 1,
            "last_update_utc": "2026-05-23T15:00:00Z"}), "not a finite number"),
    (parse({"spent_usd": math.inf, "rate_usd_per_hr": 1, "hours_elapsed": 1, "projected_total_usd": 1,
            "last_update_utc": "2026-05-23T15:00:00Z"}), "not a finite number"),
    (parse({"spent_usd": "12", "rate_usd_per_hr": 1, "hours_elapsed": 1, "projected_total_usd": 1,
            "last_update_utc": "2026-05-23T15:00:00Z"}), "not a number"),
    (parse({"spent_usd": 1, "rate_usd_per_hr": 1, "hours_elapsed": 1, "projected_total_usd": 1,
            "last_update_utc": "yesterday"}), "not an ISO-8601 time"),
])
def test_faults_extrapolate_the_last_good_reading_and_alert_once(bad, needle):
    _, mem = decide(snap(spent=10.0, rate=2.0, age_min=0), LIMITS, NOW, SLOW, Memory())
    later = NOW + timedelta(minutes=30)
    d1, mem = decide(bad, LIMITS, later, SLOW, mem)
    d2, mem = decide(bad, LIMITS, later, SLOW, mem)
    assert d1.action == Action.ALERT and needle in d1.warnings[0]
    assert d1.spent_usd == pytest.approx(10.0 + 2.0 * 0.5)     # extrapolated at the last rate
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
    d3, mem = decide(snap(spent=11.0, age_min=1), LIMITS, NOW, SLOW, mem)   # fresh again: re-armed
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
    p.write_text(json.dumps({"spent_usd": 1.0, "rate_usd_per_hr": 1.1, "hours_elapsed": 1, "projected_total_usd": 2,
                             "last_update_utc": "2026-05-23T15:42:01Z"}))
    r = read_source(str(p))
    assert r.problem is None and r.snapshot.rate_usd_per_hr == 1.1
    assert r.snapshot.last_update_utc == datetime(2026, 5, 23, 15, 42, 1, tzinfo=timezone.utc)
