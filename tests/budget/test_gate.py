"""The launch gate and --dry-run-budget (budget/gate.py): refuse an expensive rate or a plan over the cap before
anything is built, decide on the ledger's aged spend, and say what a fitted run expects."""

from __future__ import annotations

import json

from x1_pretrain import train
from x1_pretrain.budget.gate import LaunchPlan, fitting_steps, gate_problems
from x1_pretrain.budget.guard import Limits, parse

from ..conftest import FAST, TINY
from .conftest import write_budget


def test_launch_gate_refuses_expensive_rates_and_plans(demo_data, tmp_path, webhook, capsys):
    budget = tmp_path / "budget.json"
    write_budget(budget, 0.5, 20.0, rate=1.60)
    args = [
        "--config",
        str(TINY),
        "--data-dir",
        str(demo_data),
        "--ckpt-dir",
        str(tmp_path / "c"),
        *FAST,
        "--total-steps",
        "84000",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-expected-step-s",
        "2.13",
    ]
    assert train.main(args) == 3
    err = capsys.readouterr().err
    assert "launch refused" in err and "$1.60/h, above --budget-max-rate-usd-per-hr $1.40" in err
    assert "costs about $" in err and "over the cap $35.00" in err
    assert not (tmp_path / "c").exists()  # refused before anything was built or written
    write_budget(budget, 0.5, 20.0, rate=1.10)
    assert train.main([*args, "--total-steps", "3", "--force-launch", "--budget-max-rate-usd-per-hr", "1.0"]) == 0


def test_the_launch_gate_decides_on_the_ledgers_aged_spend(demo_data, tmp_path, webhook, capsys):
    """A relaunch after the sidecar restarted from zero: budget.json says $0.50, the ledger counted $33 an hour
    ago at $1.10/h. The gate, like the guard and the watchdog, takes the higher, aged spend ($34.10): 3 more
    steps plus the reserve and the $5 buffer no longer fit, so the launch is refused. Without the ledger the same
    reading launches."""
    from datetime import datetime, timedelta, timezone

    from x1_pretrain.budget.ledger import LEDGER_FILE

    budget, ckpt = tmp_path / "budget.json", tmp_path / "c"
    write_budget(budget, 0.5, 20.0, rate=1.10)
    args = [
        "--config",
        str(TINY),
        "--data-dir",
        str(demo_data),
        "--ckpt-dir",
        str(ckpt),
        *FAST,
        "--total-steps",
        "3",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-expected-step-s",
        "1.0",
    ]
    ckpt.mkdir()
    hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (ckpt / LEDGER_FILE).write_text(
        json.dumps(
            {
                "format": "x1-budget-ledger/1",
                "memory": {"spent_usd": 33.0, "spent_at_utc": hour_ago, "rate_usd_per_hr": 1.10},
                "events": [],
            }
        )
    )
    assert train.main(args) == 3
    err = capsys.readouterr().err
    assert "launch refused" in err and "spent $34.10" in err
    (ckpt / LEDGER_FILE).unlink()
    assert train.main([*args, "--ckpt-dir", str(tmp_path / "fresh")]) == 0


def test_gate_arithmetic_matches_the_errata():
    # 84,000 steps at the honest A100 throughput (~2.13 s/step at MFU 0.48) cost ~$54 at $1.10/h.
    snap = parse(
        {
            "spent_usd": 0.0,
            "rate_usd_per_hr": 1.10,
            "hours_elapsed": 0,
            "projected_total_usd": 0,
            "last_update_utc": "2026-05-23T15:42:01Z",
        }
    )
    step_s = 524288 * 609_071_616 / (312e12 * 0.48)
    plan = LaunchPlan(total_steps=84000, steps_done=0, step_s=step_s)
    limits = Limits(35.0, 30.0)
    (problem,) = gate_problems(snap, plan, limits, 1.40)
    compute = 84000 * step_s / 3600 * 1.10
    assert 54.5 < compute < 55.0  # ERRATA 2: ~$54 of compute alone
    total = compute + 1.10 * 10 / 60 + 3.0 + 5.0  # + reserve, egress and disk, buffer
    assert f"${total:.2f}" in problem and "--budget-fit" in problem
    fit = fitting_steps(snap.snapshot, plan, limits)
    assert fit == int((35 - 5 - 3 - 1.10 * 10 / 60) / 1.10 * 3600 / step_s)  # plan prints the same (test_planner)


def test_dry_run_reports_every_part(demo_data, tmp_path, webhook, capsys):
    budget = tmp_path / "budget.json"
    write_budget(budget, 0.5, 20.0)
    base = [
        "--config",
        str(TINY),
        "--data-dir",
        str(tmp_path / "no-data-needed"),
        *FAST,
        "--total-steps",
        "100",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--dry-run-budget",
    ]
    assert train.main([*base, "--budget-expected-step-s", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "READY" in out and "test alert via slack: OK" in out
    for needle in [
        "guard at now: continue",
        "guard at spent $30.01: alert",
        "guard at projected $35.01: checkpoint-and-exit",
        "guard at spent $35.01: exit-now",
    ]:
        assert needle in out, needle
    assert any("[x1 TEST]" in p["text"] for p in webhook.posts)
    assert train.main(base) == 3  # no step time on a CPU: the plan cannot be checked
    assert "--budget-expected-step-s" in capsys.readouterr().out
    budget.unlink()
    assert train.main([*base, "--budget-expected-step-s", "1.0"]) == 3
    assert "does not exist" in capsys.readouterr().out


def test_with_fit_to_budget_the_gate_says_what_it_expects_instead_of_refusing(demo_data, tmp_path, webhook, capsys):
    budget = tmp_path / "budget.json"
    write_budget(budget, 0.5, 20.0, rate=1.10)
    base = [
        "--config",
        str(TINY),
        "--data-dir",
        str(demo_data),
        "--ckpt-dir",
        str(tmp_path / "c"),
        *FAST,
        "--total-steps",
        "84000",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-expected-step-s",
        "2.13",
        "--dry-run-budget",
    ]
    assert train.main(base) == 3  # the lab's 84,000 steps do not fit: refused
    assert "--budget-fit (optim.schedule wsd) to end the schedule where the money ends" in capsys.readouterr().out
    assert train.main([*base, "--budget-fit", "--set", "optim.schedule=wsd"]) == 0
    out = capsys.readouterr().out
    assert "--budget-fit: expect to reach about step" in out and "of at most 84,000" in out and "READY" in out
