"""The budget guard inside real training runs: a test sidecar raises the spend while the tiny config
trains, and alerts go to a real HTTP server standing in for Slack."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from x1_pretrain import train
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import contract

from ..conftest import FAST, TINY
from ..procs import SMALL_BATCH, train_cmd
from .conftest import write_budget


class SpendingSidecar:
    """Raises the spend as the trainer advances: spend(step) and projected(step) are functions of the
    step the trainer reports in progress.json."""

    def __init__(self, budget: Path, ckpt: Path, spend, projected) -> None:
        self.budget, self.ckpt, self.spend, self.projected = budget, ckpt, spend, projected
        self.stop = threading.Event()
        write_budget(budget, spend(0), projected(0))
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        last = -1
        while not self.stop.is_set():
            step = max(contract.read_progress(self.ckpt).get("step", 0) if contract.read_progress(self.ckpt) else 0, 0)
            if step != last:
                write_budget(self.budget, self.spend(step), self.projected(step))
                last = step
            time.sleep(0.005)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def run_trainer(demo_data, tmp_path, spend, projected, steps=40, extra=()):
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    sidecar = SpendingSidecar(budget, ckpt, spend, projected)
    try:
        code = train.main(
            [
                "--config",
                str(TINY),
                "--data-dir",
                str(demo_data),
                "--ckpt-dir",
                str(ckpt),
                "--total-steps",
                str(steps),
                "--log-every",
                "1",
                "--ckpt-every",
                "1000",
                *FAST,
                "--budget-cap-usd",
                "35.0",
                "--budget-curr-cost-uri",
                str(budget),
                "--budget-check-every-min",
                "0.0001",
                "--budget-expected-step-s",
                "0.5",
                *extra,
            ]
        )
    finally:
        sidecar.close()
    return code, ckpt


def test_alerts_once_past_the_alert_line_and_carries_on(demo_data, tmp_path, webhook, capsys):
    code, ckpt = run_trainer(
        demo_data, tmp_path, spend=lambda s: 25.0 + 0.4 * s, projected=lambda s: 34.0, steps=20, extra=SMALL_BATCH
    )
    assert code == 0
    budget_alerts = [p for p in webhook.posts if "alert line" in p["text"]]
    assert len(budget_alerts) == 1, webhook.posts
    assert "secret-token" not in capsys.readouterr().err
    from ..procs import run_info

    client, runs = run_info(ckpt)
    spent = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "budget/spent_usd")}
    assert max(spent.values()) > 30 and min(spent.values()) < 30
    assert client.get_metric_history(runs[0].info.run_id, "budget/projected_usd")


def test_projection_over_the_cap_checkpoints_and_exits_3(demo_data, tmp_path, webhook):
    code, ckpt = run_trainer(demo_data, tmp_path, spend=lambda s: 10.0, projected=lambda s: 30.0 + s, steps=40)
    assert code == 3
    latest = ck.read_latest(ckpt)
    state, problem = ck.verify(ckpt / latest)
    assert problem is None
    assert 5 <= state["step"] <= 8  # projected crosses 35 after step 5; the check after that step acts
    assert state["budget_guard"]["action"] == "checkpoint-and-exit" and state["budget_guard"]["cap_usd"] == 35.0
    assert (ckpt / "final.safetensors").exists()  # a budget stop is the end of the run: its checkpoint is final


def test_spend_over_the_cap_exits_4_without_a_checkpoint(demo_data, tmp_path, webhook):
    # The bill jumps past the cap between two checks (e.g. a billing catch-up): the watcher thread ends the
    # process at once (os._exit, so this runs as a real process), after the alert and the exit status.
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    sidecar = SpendingSidecar(budget, ckpt, lambda s: 30.0 if s < 6 else 36.0, lambda s: 34.9)
    try:
        r = subprocess.run(
            train_cmd(
                demo_data,
                ckpt,
                400,
                "--budget-cap-usd",
                "35.0",
                "--budget-curr-cost-uri",
                str(budget),
                "--budget-check-every-min",
                "0.002",
                "--budget-expected-step-s",
                "0.5",
                "--force-launch",
                *SMALL_BATCH,
            ),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        sidecar.close()
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert ck.list_step_dirs(ckpt) == [] and ck.read_latest(ckpt) is None
    assert contract.read_exit_status(ckpt)["exit_code"] == 4
    stop = [p["text"] for p in webhook.posts if "budget stop (exit 4)" in p["text"]]
    assert len(stop) == 1 and "TERMINATE the instance" in stop[0] and "Reason: budget: spent $36" in stop[0]


def test_budget_flag_errors_are_usage_errors(tmp_path, capsys):
    base = ["--config", str(TINY), "--data-dir", str(tmp_path)]
    assert train.main([*base, "--budget-cap-usd", "35"]) == 2
    assert "needs --budget-curr-cost-uri" in capsys.readouterr().err
    assert (
        train.main([*base, "--budget-cap-usd", "35", "--budget-alert-usd", "40", "--budget-curr-cost-uri", "b.json"])
        == 2
    )
    assert "budget.alert_usd: 40.0 must be below budget.cap_usd 35.0" in capsys.readouterr().err
