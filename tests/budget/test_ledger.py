from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from x1_pretrain.budget.guard import Limits, Memory, Progress, decide, parse
from x1_pretrain.budget.ledger import FORMAT, LEDGER_FILE, Ledger

NOW = datetime(2026, 5, 23, 12, 0, tzinfo=timezone.utc)
LIMITS = Limits(35.0, 30.0)


def reading(spent: float, minutes: float = 0.0):
    return parse(
        {
            "spent_usd": spent,
            "rate_usd_per_hr": 1.1,
            "hours_elapsed": 1,
            "projected_total_usd": spent,
            "last_update_utc": (NOW + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )


def test_the_ledger_keeps_the_memory_and_the_events_across_processes(tmp_path):
    a = Ledger(tmp_path, 35.0, print)
    mem = a.load()
    d, mem = decide(reading(31.0), LIMITS, NOW, Progress(0, 10, None), mem)
    a.record(NOW, d, mem, step=7)
    data = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert data["format"] == FORMAT and data["cap_usd"] == 35.0
    assert data["memory"]["spent_usd"] == 31.0 and data["memory"]["alerts_sent"] == ["alert_line"]
    assert data["events"][-1]["kind"] == "alert" and data["events"][-1]["step"] == 7
    b = Ledger(tmp_path, 35.0, print)  # the next process
    again = b.load()
    assert again == mem
    d2, _ = decide(reading(31.5, 5), LIMITS, NOW + timedelta(minutes=5), Progress(0, 10, None), again)
    assert d2.alerts == ()  # already alerted in the previous process


def test_a_damaged_ledger_is_set_aside_and_the_checkpoint_snapshot_used(tmp_path):
    (tmp_path / LEDGER_FILE).write_text("{half a file")
    logs: list[str] = []
    _, mem = decide(reading(20.0), LIMITS, NOW, Progress(0, 10, None), Memory())
    from x1_pretrain.budget.ledger import memory_to_json

    got = Ledger(tmp_path, 35.0, logs.append).load({"memory": memory_to_json(mem)})
    assert got == mem
    assert any("cannot be read" in line for line in logs)
    assert list(tmp_path.glob(f"{LEDGER_FILE}.bad-*"))  # kept for a post-mortem, not overwritten


def test_a_ledger_that_cannot_be_written_does_not_stop_the_guard(tmp_path):
    logs: list[str] = []
    led = Ledger(tmp_path / "gone" / "dir", 35.0, logs.append)
    led.save(NOW, Memory(spent_usd=1.0))
    assert any("cannot write" in line for line in logs)


def test_only_a_dict_with_the_format_and_finite_non_negative_money_is_a_ledger(tmp_path):
    from x1_pretrain.budget.ledger import memory_to_json, parse_text, problem_of

    good = {
        "format": FORMAT,
        "cap_usd": 35.0,
        "memory": memory_to_json(Memory(spent_usd=3.0, earlier_usd=1.5, machines=(("a", 1.5),))),
    }
    assert problem_of(good, "L") is None
    assert "not an x1 budget ledger" in parse_text(b"[1, 2]", "L")[1]
    assert "cannot be read" in parse_text(b"{half", "L")[1]
    assert "not an x1 budget ledger" in problem_of({**good, "format": "x1-budget-ledger/0"}, "L")
    for key, value in (
        ("spent_usd", -1.0),
        ("earlier_machines_usd", -100.0),
        ("rate_usd_per_hr", float("inf")),
        ("launch_rate_usd_per_hr", float("nan")),
        ("spent_usd", "40"),
        ("spent_usd", True),
    ):
        bad = {**good, "memory": {**good["memory"], key: value}}
        assert f"memory.{key} = {value!r}" in problem_of(bad, "L"), (key, value)
    bad = {**good, "memory": {**good["memory"], "machines": [{"machine": "a", "compute_usd": -5}]}}
    assert "memory.machines[0].compute_usd = -5" in problem_of(bad, "L")
    assert "memory is list" in problem_of({**good, "memory": []}, "L")
    # on this disk too: a damaged one is set aside, never used
    (tmp_path / LEDGER_FILE).write_text(
        json.dumps({**good, "memory": {"spent_usd": 5.0, "earlier_machines_usd": -1e9}})
    )
    logs: list[str] = []
    assert Ledger(tmp_path, 35.0, logs.append).load() == Memory()
    assert list(tmp_path.glob(f"{LEDGER_FILE}.bad-*")) and any("earlier_machines_usd" in x for x in logs)
