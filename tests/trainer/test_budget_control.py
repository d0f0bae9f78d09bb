"""The budget guard inside the trainer: its watcher thread acts whatever the training thread is doing."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from x1_pretrain.budget.guard import Action, Limits
from x1_pretrain.budget.ledger import LEDGER_FILE
from x1_pretrain.budget.money import Lines
from x1_pretrain.core import contract
from x1_pretrain.core.config import BudgetConfig
from x1_pretrain.core.contract import EXIT_BUDGET_NOW
from x1_pretrain.trainer.budget_control import BudgetControl, BudgetSetup, stop_message

from ..conftest import REPO
from ..procs import train_cmd, train_here

NO_LINES = Lines(egress_usd=0.0, disk_usd=0.0, buffer_usd=0.0)


def budget_json(path: Path, spent: float, projected: float | None = None, rate: float = 1.10) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "spent_usd": spent,
                "rate_usd_per_hr": rate,
                "hours_elapsed": 1.0,
                "projected_total_usd": spent if projected is None else projected,
                "fixed_usd": {"disk_usd": 0.0, "egress_usd": 0.0},
                "last_update_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )
    tmp.replace(path)


class Alerts:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def channels(self) -> list[str]:
        return ["test"]

    def send_within(self, subject: str, body: str, deadline_s: float = 20.0) -> dict:
        self.sent.append((subject, body))
        return {}


def test_projected_over_the_cap_without_a_step_boundary_exits_4_and_says_so(tmp_path):
    budget = tmp_path / "budget.json"
    budget_json(budget, 20.0, projected=40.0)
    alerts = Alerts()
    setup = BudgetSetup(BudgetConfig(cap_usd=35.0, stop_wait_s=0.3), str(budget), Limits(35.0, 30.0), alerts)
    control = BudgetControl(setup, tmp_path, lambda m: None, None)
    exited = threading.Event()
    codes: list[int] = []
    control._exit = lambda code: (codes.append(code), exited.set())
    decision = control.monitor.check()
    assert decision.action == Action.CHECKPOINT_AND_EXIT
    control.on_verdict(decision)  # the loop never reaches a step boundary ...
    assert exited.wait(5) and codes == [EXIT_BUDGET_NOW]
    status = contract.read_exit_status(tmp_path)
    assert status["exit_code"] == 4 and "no step boundary came within 0.3 s" in status["reason"]
    subject, body = alerts.sent[-1]
    assert "exit 4" in subject and "No checkpoint was written" in body and "TERMINATE" in body
    events = json.loads((tmp_path / LEDGER_FILE).read_text())["events"]
    assert events[-1]["kind"] == "budget_stop" and events[-1]["exit_code"] == 4


def test_a_boundary_in_time_cancels_the_timer_and_checkpoints():
    class Run:
        checkpointer = None
        horizon = None
        end_step = 10
        proposed_end = 0

        class cfg:
            class train:
                total_steps = 10

    class State:
        step = 3

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        budget = Path(d) / "budget.json"
        budget_json(budget, 20.0, projected=40.0)
        setup = BudgetSetup(BudgetConfig(cap_usd=35.0, stop_wait_s=0.5), str(budget), Limits(35.0, 30.0), Alerts())
        control = BudgetControl(setup, Path(d), lambda m: None, None)
        codes: list[int] = []
        control._exit = codes.append
        control.on_verdict(control.monitor.check())
        timer = control._timer
        outcome, checkpoint = control.after_step(Run, State, {})
        timer.join(timeout=10)  # the timer's thread ends at once when cancelled, without firing
        assert not timer.is_alive() and timer.finished.is_set()
        assert (outcome.exit_code, checkpoint, codes) == (3, True, [])
        # a stop asked for while the last step ran cuts nothing: the run finishes (exit 0 from the loop)
        control.on_verdict(control.monitor.check())
        State.step = Run.end_step
        assert control.after_step(Run, State, {}) is None and control.request is None


def test_a_fit_check_late_in_a_step_counts_what_that_step_has_already_cost(tmp_path):
    """--budget-fit, near the end of the money: $0.60 of reserve plus less than half a $0.10 step is left.
    A check 9 s into a 10 s step knows that 0.9 of the step in flight is already in the spend, so that step
    still fits and becomes the end (exit 0 at min_lr). Seen under load before the fix: the same money at the end
    of a step read as "not even one more step", and the run was cut one step before its decay ended."""
    from x1_pretrain.core.config import OptimConfig
    from x1_pretrain.trainer.budget_control import FitContext

    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, schedule="wsd", decay_fraction=0.5)

    def refit_after(in_flight_s: float, d: Path) -> BudgetControl:
        d.mkdir()
        budget = d / "budget.json"
        budget_json(budget, 35.0 - 0.60 - 0.05, rate=36.0)  # $0.01 a second, so a 10 s step is $0.10
        limits = Limits(35.0, 30.0, lines=NO_LINES, reserve_min=1.0)
        setup = BudgetSetup(BudgetConfig(cap_usd=35.0), str(budget), limits, Alerts())
        control = BudgetControl(
            setup, d, lambda m: None, None, fit=FitContext(total_steps=400, optim=optim, expected_step_s=None)
        )
        control.monitor.note_step(65, 400, 0.0)
        control.monitor.steps_per_hour = 360.0  # measured: 10 s a step
        control.monitor._last_step_at -= in_flight_s  # the step after 65 has run this long
        control.on_verdict(control.monitor.check())
        return control

    late = refit_after(9.0, tmp_path / "late")
    assert late.request is None and late.proposed_end == 66  # the step in flight is the last, and it fits
    early = refit_after(1.0, tmp_path / "early")  # the same money with 9 s of the step still to pay
    assert early.request is not None and "not even one more step fits" in early.request[1]
    assert early.request[0] == 3


def test_max_hours_counts_from_the_runs_first_start_in_the_ledger(tmp_path):
    """--budget-max-hours 3: the ledger says the run first started 2 h 30 min ago (two processes and a preemption gap
    ago), while this process started now and the checkpoint counts only 1 h of training wall time. The money
    is plenty; the time left (30 min, less the 6 min reserve) is what bounds the end: 24 min of 60 s steps."""
    from x1_pretrain.core.config import OptimConfig
    from x1_pretrain.trainer.budget_control import FitContext

    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, schedule="wsd", decay_fraction=0.5)
    budget = tmp_path / "budget.json"
    budget_json(budget, 5.0, rate=1.0)
    first = datetime.fromtimestamp(time.time() - 2.5 * 3600, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp_path / LEDGER_FILE).write_text(
        json.dumps({"format": "x1-budget-ledger/1", "run_started_utc": first, "memory": {}, "events": []})
    )
    limits = Limits(1000.0, 900.0, lines=NO_LINES, reserve_min=6.0)
    setup = BudgetSetup(BudgetConfig(cap_usd=1000.0), str(budget), limits, Alerts())
    fit = FitContext(
        total_steps=10_000,
        optim=optim,
        expected_step_s=60.0,
        max_hours=3.0,
        first_start_estimate_unix=time.time() - 3600,
    )
    control = BudgetControl(setup, tmp_path, lambda m: None, None, fit=fit)
    control.monitor.note_step(100, 10_000, 0.0)
    control.on_verdict(control.monitor.check())
    assert control.proposed_end in (100 + 24 - 1, 100 + 23 - 1)  # FIT_SLACK_STEPS short; a second's rounding
    saved = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert saved["run_started_utc"] == first  # kept for the next process


def test_a_ledger_without_a_first_start_records_the_estimate(tmp_path):
    from x1_pretrain.budget.ledger import Ledger

    ledger = Ledger(tmp_path, 35.0)
    ledger.load()
    t = ledger.run_started(1_700_000_000.0)
    ledger.save(datetime.now(timezone.utc), ledger.load())
    again = Ledger(tmp_path, 35.0)
    again.load()
    assert t == 1_700_000_000.0 and again.run_started(0.0) == t


def test_stop_messages_say_what_to_do_next():
    s, b = stop_message(3, "budget: projected $36", 35.0, 30.5, "/ckpt/step_0001000")
    assert "exit 3" in s and "$30.50 of $35.00" in s and "/ckpt/step_0001000" in b and "export_run" in b


def test_spend_over_the_cap_during_a_cold_compile_exits_4_within_seconds(demo_data, tmp_path):
    """The lab's "torch.compile hangs on the first step": the training thread is inside a cold compile when
    the spend passes the cap; the watcher thread ends the process anyway."""
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    budget_json(budget, 10.0)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    cmd = train_cmd(
        demo_data,
        ckpt,
        5,
        "--compile",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-check-every-min",
        "0.01",
        "--force-launch",
    )
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    try:
        for line in proc.stdout:
            out.append(line)
            if "budget check:" in line and any("torch.compile mode=" in x for x in out):
                break  # the check before the first step passed: its compile starts now
        budget_json(budget, 36.0)  # the watcher's next check comes within 0.6 s, well inside the compile
        crossed = time.monotonic()
        out.append(proc.communicate(timeout=120)[0])
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - crossed
    text = "".join(out)
    assert proc.returncode == 4, text[-3000:]
    # 1-3 s on an idle machine; 10.7 s was seen with the other test worker compiling on the same 2 cores. The
    # bound is loose (a loaded compat lane is slower still): the exit mid-compile is what the next line proves.
    assert took < 60.0, f"{took:.1f} s from the crossing to the exit"
    assert not (ckpt / "progress.json").exists(), "the first step never finished: the exit came mid-compile"
    assert "spent $36" in text and contract.read_exit_status(ckpt)["exit_code"] == 4


def test_unknown_spend_is_counted_across_restarts(demo_data, tmp_path, capsys):
    """No budget.json ever appears. Each start of the trainer (here three in this process: the ledger on disk is
    all one start hands the next) begins with the ledger's "unknown since"; a later one stops at start once that
    moment is older than the grace, however young the start itself is."""
    ckpt, budget = tmp_path / "c", tmp_path / "no-budget.json"
    base = [
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-check-every-min",
        "60",
        "--resume-from-latest",
        "--set",
        "checkpoint.async_save=false",
    ]
    first = train_here(train_cmd(demo_data, ckpt, 2, *base, "--budget-unknown-grace-min", "60", ckpt_every=1))
    assert first == 0, capsys.readouterr().out[-2000:]
    since = json.loads((ckpt / LEDGER_FILE).read_text())["memory"]["unknown_since_utc"]
    assert since is not None
    second = train_here(
        train_cmd(demo_data, ckpt, 4, *base, "--budget-unknown-grace-min", "60", "--allow-config-change", ckpt_every=1)
    )
    assert second == 0 and json.loads((ckpt / LEDGER_FILE).read_text())["memory"]["unknown_since_utc"] == since, (
        "a new start does not restart the clock"
    )
    began = datetime.fromisoformat(since.replace("Z", "+00:00"))
    waited_min = (datetime.now(timezone.utc) - began).total_seconds() / 60
    grace = waited_min / 2  # far longer than a fresh start would have waited at its first check
    capsys.readouterr()
    third = train_here(
        train_cmd(
            demo_data,
            ckpt,
            6,
            *base,
            "--budget-unknown-grace-min",
            f"{grace:.4f}",
            "--allow-config-change",
            ckpt_every=1,
        )
    )
    out = capsys.readouterr()
    assert third == 3, out.out[-2000:] + out.err[-2000:]
    assert "spend unknown" in out.err and "before training" in out.err  # a stop: a warning
    assert (ckpt / "final.safetensors").exists()  # the run ends at its last checkpoint


def test_the_fit_counts_the_task_evaluations_at_their_measured_cost(tmp_path):
    """Steps of 10 s and a task evaluation of 50 s every 10 steps, the clock faked. The speed measured just
    before an evaluation and just after it is the same 15 s a step (the evaluation taken out of the measurement
    and put back at 5 s a step), and the reserve holds the evaluation at the end: the fit ends the run where
    $100 less the $0.60 reserve and the $0.50 final evaluation pays for 15 s steps at $0.01 a second."""
    import dataclasses

    from x1_pretrain.budget.money import EvalCost
    from x1_pretrain.core.config import OptimConfig
    from x1_pretrain.trainer.budget_control import FitContext

    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, schedule="wsd", decay_fraction=0.5)
    budget = tmp_path / "budget.json"
    budget_json(budget, 0.0, rate=36.0)
    setup = BudgetSetup(
        BudgetConfig(cap_usd=100.0), str(budget), Limits(100.0, 90.0, lines=NO_LINES, reserve_min=1.0), Alerts()
    )
    now = [0.0]
    evals = EvalCost(every=10, in_steps=2.0)  # estimated at 2 steps (20 s) until one is timed
    control = BudgetControl(
        setup,
        tmp_path,
        lambda m: None,
        None,
        fit=FitContext(total_steps=100_000, optim=optim, expected_step_s=None),
        evals=lambda: evals,
    )
    control.monitor._fx = dataclasses.replace(control.monitor._fx, monotonic=lambda: now[0])
    speeds = []
    for step in range(1, 26):
        now[0] += 10.0
        if step % 10 == 0:  # the evaluation runs after this step, before the budget hears of it
            now[0] += 50.0
            evals = dataclasses.replace(evals, measured_s=50.0, spent_s=evals.spent_s + 50.0)
        control.monitor.note_step(step, 100_000, 0.0, evals)
        if step in (9, 11, 19, 21):
            speeds.append(control.monitor.steps_per_hour)
    assert speeds[0] == pytest.approx(3600 / 12.0)  # before any timing: 10 s + 20 s / 10
    assert speeds[1:] == pytest.approx([3600 / 15.0] * 3)  # measured: 10 s + 50 s / 10, across an eval or not
    assert control.monitor.progress().final_eval_s == 50.0
    control.on_verdict(control.monitor.check())
    steps_that_fit = int((100.0 - 0.60 - 0.50) / 0.15 + 1e-9)
    assert control.proposed_end == 25 + steps_that_fit - 1  # FIT_SLACK_STEPS short


def test_a_resume_on_slower_hardware_re_plans_once_the_speed_is_measured_not_at_the_next_check(tmp_path):
    """The plan expected 1 s a step (the old GPU) and the checks come every 30 min; on the new machine a step
    takes 10 s and the price is $36/h. Three warm-up steps and two measured ones later the watcher checks at
    once, and the fit ends the run where $100 pays for 10 s steps at $0.01 a second, not 1 s steps."""
    import dataclasses
    from types import SimpleNamespace

    from x1_pretrain.core.config import OptimConfig
    from x1_pretrain.trainer.budget_control import FitContext

    from ..servers import wait_until

    optim = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, schedule="wsd", decay_fraction=0.5)
    budget = tmp_path / "budget.json"
    budget_json(budget, 0.0, rate=36.0)
    setup = BudgetSetup(
        BudgetConfig(cap_usd=100.0, check_every_min=30.0),
        str(budget),
        Limits(100.0, 90.0, lines=NO_LINES, reserve_min=1.0),
        Alerts(),
    )
    logs: list[str] = []
    control = BudgetControl(
        setup, tmp_path, logs.append, None, fit=FitContext(total_steps=100_000, optim=optim, expected_step_s=1.0)
    )
    now = [0.0]
    control.monitor._fx = dataclasses.replace(control.monitor._fx, monotonic=lambda: now[0])
    run = SimpleNamespace(checkpointer=None, horizon=None, end_step=100_000, proposed_end=0)
    control.watcher.start()
    try:
        for step in range(1, 6):
            now[0] += 10.0
            control.after_step(run, SimpleNamespace(step=step), None)
            assert control.watcher.checks == 0 or step == 5
        assert wait_until(lambda: control.watcher.checks >= 1, timeout=30)
        assert wait_until(lambda: control.proposed_end > 0 or run.proposed_end > 0, timeout=30)
    finally:
        control.close()
    assert any("10.00 s a step measured after the warm-up" in x for x in logs), logs
    end = control.proposed_end or run.proposed_end
    assert 500 < end < 5 + (100.0 - 0.60) / 0.10  # 10 s steps at $0.01/s: ~990 more, where 1 s steps would give ~9,900
