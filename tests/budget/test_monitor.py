"""The budget guard inside real training runs: a test sidecar raises the spend while the tiny config
trains, and alerts go to a real HTTP server standing in for Slack."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from x1_pretrain import train
from x1_pretrain.budget.gate import Plan, fitting_steps, gate_problems
from x1_pretrain.budget.guard import Limits, parse
from x1_pretrain.training import checkpoint as ck

from ..conftest import FAST, TINY
from ..procs import train_cmd


class Webhook:
    """A real HTTP server on 127.0.0.1 recording the JSON bodies posted to it."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts.append(json.loads(body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/secret-token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def webhook(monkeypatch):
    hook = Webhook()
    monkeypatch.setenv("X1_SLACK_WEBHOOK_URL", hook.url)
    for k in ("X1_SMTP_HOST", "X1_SMTP_TO"):
        monkeypatch.delenv(k, raising=False)
    yield hook
    hook.close()


def write_budget(path: Path, spent: float, projected: float, rate: float = 1.10, when: datetime | None = None):
    """A budget.json as the sidecar writes it; spent_usd is the whole bill (fixed_usd says what it carries)."""
    when = when or datetime.now(timezone.utc)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"spent_usd": spent, "rate_usd_per_hr": rate, "hours_elapsed": spent / rate,
                               "projected_total_usd": projected, "fixed_usd": {"disk_usd": 0.0, "egress_usd": 0.0},
                               "last_update_utc": when.strftime("%Y-%m-%dT%H:%M:%SZ")}))
    tmp.replace(path)


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
            step = max(ck.read_progress(self.ckpt).get("step", 0) if ck.read_progress(self.ckpt) else 0, 0)
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
        code = train.main(["--config", str(TINY), "--data-dir", str(demo_data), "--ckpt-dir", str(ckpt),
                           "--total-steps", str(steps), "--log-every", "1", "--ckpt-every", "1000", *FAST,
                           "--budget-cap-usd", "35.0", "--budget-curr-cost-uri", str(budget),
                           "--budget-check-every-min", "0.0001", "--expected-step-s", "0.5", *extra])
    finally:
        sidecar.close()
    return code, ckpt


def test_alerts_once_past_the_alert_line_and_carries_on(demo_data, tmp_path, webhook, capsys):
    code, ckpt = run_trainer(demo_data, tmp_path, spend=lambda s: 25.0 + 0.4 * s, projected=lambda s: 34.0, steps=20)
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
    assert state["budget"]["action"] == "checkpoint-and-exit" and state["budget"]["cap_usd"] == 35.0
    assert (ckpt / "final.safetensors").exists()  # a budget stop is the end of the run: its checkpoint is final


def test_spend_over_the_cap_exits_4_without_a_checkpoint(demo_data, tmp_path, webhook):
    # The bill jumps past the cap between two checks (e.g. a billing catch-up): the watcher thread ends the
    # process at once (os._exit, so this runs as a real process), after the alert and the exit status.
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    sidecar = SpendingSidecar(budget, ckpt, lambda s: 30.0 if s < 6 else 36.0, lambda s: 34.9)
    try:
        r = subprocess.run(train_cmd(demo_data, ckpt, 400, "--budget-cap-usd", "35.0", "--budget-curr-cost-uri",
                                     str(budget), "--budget-check-every-min", "0.002", "--expected-step-s", "0.5",
                                     "--force-launch"),
                           capture_output=True, text=True, timeout=300)
    finally:
        sidecar.close()
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-2000:]
    assert ck.list_step_dirs(ckpt) == [] and ck.read_latest(ckpt) is None
    assert ck.read_exit_status(ckpt)["exit_code"] == 4
    stop = [p["text"] for p in webhook.posts if "budget stop (exit 4)" in p["text"]]
    assert len(stop) == 1 and "TERMINATE the instance" in stop[0] and "Reason: budget: spent $36" in stop[0]


def test_launch_gate_refuses_expensive_rates_and_plans(demo_data, tmp_path, webhook, capsys):
    budget = tmp_path / "budget.json"
    write_budget(budget, 0.5, 20.0, rate=1.60)
    args = ["--config", str(TINY), "--data-dir", str(demo_data), "--ckpt-dir", str(tmp_path / "c"), *FAST,
            "--total-steps", "84000", "--budget-cap-usd", "35", "--budget-curr-cost-uri", str(budget),
            "--expected-step-s", "2.13"]
    assert train.main(args) == 3
    err = capsys.readouterr().err
    assert "launch refused" in err and "$1.60/h, above --max-rate-usd-per-hr $1.40" in err
    assert "costs about $" in err and "over the cap $35.00" in err
    assert not (tmp_path / "c").exists()  # refused before anything was built or written
    write_budget(budget, 0.5, 20.0, rate=1.10)
    assert train.main([*args, "--total-steps", "3", "--force-launch", "--max-rate-usd-per-hr", "1.0"]) == 0


def test_the_launch_gate_decides_on_the_ledgers_aged_spend(demo_data, tmp_path, webhook, capsys):
    """A relaunch after the sidecar restarted from zero: budget.json says $0.50, the ledger counted $33 an hour
    ago at $1.10/h. The gate, like the guard and the watchdog, takes the higher, aged spend ($34.10): 3 more
    steps plus the reserve and the $5 buffer no longer fit, so the launch is refused. Without the ledger the same
    reading launches."""
    from datetime import datetime, timedelta, timezone

    from x1_pretrain.budget.ledger import LEDGER_FILE

    budget, ckpt = tmp_path / "budget.json", tmp_path / "c"
    write_budget(budget, 0.5, 20.0, rate=1.10)
    args = ["--config", str(TINY), "--data-dir", str(demo_data), "--ckpt-dir", str(ckpt), *FAST, "--total-steps",
            "3", "--budget-cap-usd", "35", "--budget-curr-cost-uri", str(budget), "--expected-step-s", "1.0"]
    ckpt.mkdir()
    hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (ckpt / LEDGER_FILE).write_text(json.dumps({"format": "x1-budget-ledger/1", "memory": {
        "spent_usd": 33.0, "spent_at_utc": hour_ago, "rate_usd_per_hr": 1.10}, "events": []}))
    assert train.main(args) == 3
    err = capsys.readouterr().err
    assert "launch refused" in err and "spent $34.10" in err
    (ckpt / LEDGER_FILE).unlink()
    assert train.main([*args, "--ckpt-dir", str(tmp_path / "fresh")]) == 0


def test_gate_arithmetic_matches_the_errata():
    # 84,000 steps at the honest A100 throughput (~2.13 s/step at MFU 0.48) cost ~$54 at $1.10/h.
    snap = parse({"spent_usd": 0.0, "rate_usd_per_hr": 1.10, "hours_elapsed": 0, "projected_total_usd": 0,
                  "last_update_utc": "2026-05-23T15:42:01Z"})
    step_s = 524288 * 609_071_616 / (312e12 * 0.48)
    plan = Plan(84000, 0, step_s)
    limits = Limits(35.0, 30.0)
    (problem,) = gate_problems(snap, plan, limits, 1.40)
    compute = 84000 * step_s / 3600 * 1.10
    assert 54.5 < compute < 55.0                         # ERRATA 2: ~$54 of compute alone
    total = compute + 1.10 * 10 / 60 + 3.0 + 5.0         # + reserve, egress and disk, buffer
    assert f"${total:.2f}" in problem and "--fit-to-budget" in problem
    fit = fitting_steps(snap.snapshot, plan, limits)
    assert fit == int((35 - 5 - 3 - 1.10 * 10 / 60) / 1.10 * 3600 / step_s)   # plan prints the same (test_planner)


def test_dry_run_reports_every_part(demo_data, tmp_path, webhook, capsys):
    budget = tmp_path / "budget.json"
    write_budget(budget, 0.5, 20.0)
    base = ["--config", str(TINY), "--data-dir", str(tmp_path / "no-data-needed"), *FAST, "--total-steps", "100",
            "--budget-cap-usd", "35", "--budget-curr-cost-uri", str(budget), "--dry-run-budget"]
    assert train.main([*base, "--expected-step-s", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "READY" in out and "test alert via slack: OK" in out
    for needle in ["guard at now: continue", "guard at spent $30.01: alert", "guard at projected $35.01: "
                   "checkpoint-and-exit", "guard at spent $35.01: exit-now"]:
        assert needle in out, needle
    assert any("[x1 TEST]" in p["text"] for p in webhook.posts)
    assert train.main(base) == 3  # no step time on a CPU: the plan cannot be checked
    assert "--expected-step-s" in capsys.readouterr().out
    budget.unlink()
    assert train.main([*base, "--expected-step-s", "1.0"]) == 3
    assert "does not exist" in capsys.readouterr().out


def test_budget_flag_errors_are_usage_errors(tmp_path, capsys):
    base = ["--config", str(TINY), "--data-dir", str(tmp_path)]
    assert train.main([*base, "--budget-cap-usd", "35"]) == 2
    assert "needs --budget-curr-cost-uri" in capsys.readouterr().err
    assert train.main([*base, "--budget-cap-usd", "35", "--budget-alert-usd", "40",
                       "--budget-curr-cost-uri", "b.json"]) == 2
    assert "must be below --budget-cap-usd" in capsys.readouterr().err


def test_with_fit_to_budget_the_gate_says_what_it_expects_instead_of_refusing(demo_data, tmp_path, webhook, capsys):
    budget = tmp_path / "budget.json"
    write_budget(budget, 0.5, 20.0, rate=1.10)
    base = ["--config", str(TINY), "--data-dir", str(demo_data), "--ckpt-dir", str(tmp_path / "c"), *FAST,
            "--total-steps", "84000", "--budget-cap-usd", "35", "--budget-curr-cost-uri", str(budget),
            "--expected-step-s", "2.13", "--dry-run-budget"]
    assert train.main(base) == 3                      # the lab's 84,000 steps do not fit: refused
    assert "--fit-to-budget (optim.schedule wsd) to end the schedule where the money ends" in capsys.readouterr().out
    assert train.main([*base, "--fit-to-budget", "--set", "optim.schedule=wsd"]) == 0
    out = capsys.readouterr().out
    assert "--fit-to-budget: expect to reach about step" in out and "of at most 84,000" in out and "READY" in out
