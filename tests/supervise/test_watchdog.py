from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from x1_pretrain import watchdog as W_cli
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import contract
from x1_pretrain.supervise import watchdog as W

from ..conftest import REPO
from ..procs import SMALL_BATCH, Terminal, progress_step, run_info, start, train_cmd, wait_for
from ..servers import JsonServer, wait_until


def fake_trainer(
    tmp_path, codes: list[int], progress: bool = True, places: list[tuple[int | None, int | None]] | None = None
) -> list[str]:
    """A real child process that exits with the next code of ``codes`` and records its argv. Start n logs step
    10*(n+1) (each start gets further, as a run that crashes now and then does) unless ``progress`` is off, or
    the (step logged, newest checkpoint step) of ``places``."""
    script = tmp_path / "fake_train.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, signal, sys, time
        state = {str(tmp_path / "calls.jsonl")!r}
        n = sum(1 for _ in open(state)) if os.path.exists(state) else 0
        with open(state, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "restart": os.environ.get("X1_RESTART_COUNT")}}) + "\\n")
        ckpt = {str(tmp_path / "ckpt")!r}
        os.makedirs(ckpt, exist_ok=True)
        places = {places!r}
        step, saved = places[n] if places else ((10 * (n + 1) if {progress!r} else None), None)
        if step is not None:
            with open(os.path.join(ckpt, "progress.json"), "w") as f:
                json.dump({{"pid": os.getpid(), "step": step, "time_unix": time.time()}}, f)
        if saved is not None:
            with open(os.path.join(ckpt, "latest"), "w") as f:
                f.write("step_%07d\\n" % saved)
        code = {codes!r}[n]
        if code < 0:
            os.kill(os.getpid(), -code)
        sys.exit(code)
    """)
    )
    return [sys.executable, str(script), "--ckpt-dir", str(tmp_path / "ckpt")]


def calls(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


def run_watchdog(cmd: list[str], *opts: str) -> int:
    return W_cli.main([*opts, "--backoff-s", "0.01", "--", *cmd])


@pytest.mark.parametrize("code", [0, 2, 3, 4, 5, 6, 130])
def test_never_relaunches_after_a_decision(tmp_path, code):
    assert run_watchdog(fake_trainer(tmp_path, [code, 0])) == code
    assert len(calls(tmp_path)) == 1


def test_relaunches_crashes_preemptions_and_signals_with_resume(tmp_path):
    log = tmp_path / "events.jsonl"
    assert run_watchdog(fake_trainer(tmp_path, [1, 75, -signal.SIGKILL, 0]), "--log-file", str(log)) == 0
    c = calls(tmp_path)
    assert len(c) == 4
    assert "--resume-from-latest" not in c[0]["argv"]
    assert all(x["argv"].count("--resume-from-latest") == 1 for x in c[1:])
    assert [x["restart"] for x in c] == ["0", "1", "2", "3"]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    relaunched = [e for e in events if e["event"] == "relaunched"]
    assert [e["exit_code"] for e in relaunched] == [1, 75, -9]
    assert [e["reason"] for e in relaunched] == [
        "unexpected failure",
        "interrupted after a checkpoint",
        "killed by SIGKILL",
    ]
    assert all(e["downtime_s"] is not None for e in relaunched)
    assert [e["event"] for e in events[-2:]] == ["final_exit", "still_billing"] and events[-2]["restarts"] == 3


def test_gives_up_after_max_restarts(tmp_path):
    assert run_watchdog(fake_trainer(tmp_path, [1, 1, 1, 1]), "--max-restarts", "2") == 1
    assert len(calls(tmp_path)) == 3


def test_backoff_doubles_on_consecutive_crashes():
    wd = W.Watchdog(["x"], W.WatchdogOptions(max_restarts=5, backoff_s=1.0, max_backoff_s=60.0))
    assert wd.opts.backoff_s == 1.0 and W.should_relaunch(-15) and W.should_relaunch(137) and not W.should_relaunch(130)
    assert contract.with_resume(["a", "--resume-from-latest"]) == ["a", "--resume-from-latest"]
    assert contract.ckpt_dir_of(["t", "--ckpt-dir=/x"]).as_posix() == "/x"


def test_the_watchdog_starts_without_torch():
    """The watchdog reads small files and runs a process: it imports neither torch nor MLflow nor boto3, so it starts
    in a fraction of a trainer's time (each relaunch, each test that runs it)."""
    probe = (
        "import sys, x1_pretrain.watchdog as w; w.build_parser(); "
        "print(sorted(m for m in ('torch', 'numpy', 'mlflow', 'boto3') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]


def test_usage_errors(capsys):
    assert W_cli.main(["--max-restarts", "1"]) == 2
    assert W_cli.main(["--"]) == 2


def test_preempted_trainer_is_resumed_and_the_curve_is_continuous(demo_data, tmp_path):
    """A real trainer under the watchdog gets SIGTERM mid-run (a spot preemption): it checkpoints, exits
    75, the watchdog relaunches it with --resume-from-latest, and the MLflow run has every step once."""
    ckpt = tmp_path / "c"
    log = tmp_path / "events.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--log-file",
        str(log),
        "--",
        *train_cmd(demo_data, ckpt, 10, ckpt_every=1000),
    ]  # FAST's batch: the SIGTERM comes long before the end
    proc = start(cmd, tmp_path / "out.log")
    wait_for(lambda: progress_step(ckpt) >= 3, proc=proc)
    trainer_pid = json.loads((ckpt / "progress.json").read_text())["pid"]
    os.kill(trainer_pid, signal.SIGTERM)
    assert proc.wait(timeout=180) == 0, (tmp_path / "out.log").read_text()[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (re,) = [e for e in events if e["event"] == "relaunched"]
    assert re["exit_code"] == 75 and re["steps_lost"] == 0
    assert re["relaunch_latency_s"] is not None and 0 < re["relaunch_latency_s"] < 120
    client, runs = run_info(ckpt)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["restarts"] == "1"
    steps = sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss"))
    assert steps == list(range(1, 11))


def test_sigterm_to_the_watchdog_is_forwarded_and_not_relaunched(demo_data, tmp_path):
    """SIGTERM to the watchdog reaches the trainer, which checkpoints and exits 75: no relaunch. (SIGHUP, the same
    forwarding as SIGTERM, comes from a real closed terminal in the test after this one.)"""
    ckpt = tmp_path / "c"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--",
        *train_cmd(demo_data, ckpt, 500, *SMALL_BATCH),
    ]
    proc = start(cmd, tmp_path / "out.log")
    wait_for(lambda: progress_step(ckpt) >= 2, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    out = (tmp_path / "out.log").read_text()
    assert "forwarded to the trainer" in out and "not relaunching" in out
    assert (ckpt / "latest").exists()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone for our purpose (its parent, the killed watchdog, cannot reap it)
    try:
        return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_closed_terminal_stops_the_run_with_its_checkpoint_and_leaves_no_orphan(demo_data, tmp_path):
    """watchdog -- train on a real terminal that closes mid-run (an SSH session that ends): the watchdog gets
    SIGHUP and every later write to the terminal fails with EIO. The stop still reaches the trainer (SIGHUP forwarded
    as SIGTERM: the trainer runs in its own session, so nothing else signals it), which writes its stop checkpoint
    and exits 75; the watchdog exits 75 without relaunching; nothing is left running."""
    ckpt, events = tmp_path / "c", tmp_path / "events.jsonl"
    term = Terminal(
        [
            sys.executable,
            "-m",
            "x1_pretrain.watchdog",
            "--backoff-s",
            "0.1",
            "--events-file",
            str(events),
            "--",
            *train_cmd(demo_data, ckpt, 2000, *SMALL_BATCH),
        ]
    )
    try:
        wait_for(lambda: progress_step(ckpt) >= 3, proc=term.proc)
        trainer = json.loads((ckpt / "progress.json").read_text())["pid"]
        assert "step" in term.output()  # the run was talking to the terminal
        term.close()
        assert term.proc.wait(timeout=120) == 75
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
    assert wait_until(lambda: _gone(trainer), timeout=30), "the trainer outlived the closed terminal"
    status = contract.read_exit_status(ckpt)
    assert status["exit_code"] == 75, status
    assert status_step(ckpt) >= 3  # --ckpt-every 1000: the only checkpoint is the stop's
    logged = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [e["event"] for e in logged]
    assert kinds[0] == "stopped" and "relaunched" not in kinds and "still_billing" in kinds
    assert logged[0]["exit_code"] == 75  # "after the forwarded signal; not relaunching"


def status_step(ckpt) -> int:
    """The step of the newest complete checkpoint (its trainer_state.json)."""
    latest = ck.read_latest(ckpt)
    return json.loads((ckpt / latest / "trainer_state.json").read_text())["step"]


def test_a_detached_run_does_not_notice_its_terminal_closing(demo_data, tmp_path):
    """--detach --log-file: the command returns at once with the pid and how to follow and stop the run; the
    terminal then closes and the run goes on to its end, its output in the log."""
    ckpt, log = tmp_path / "c", tmp_path / "logs" / "run.log"
    term = Terminal(
        [
            sys.executable,
            "-m",
            "x1_pretrain.watchdog",
            "--detach",
            "--log-file",
            str(log),
            "--",
            *train_cmd(demo_data, ckpt, 4, *SMALL_BATCH, log_every=2),
        ]
    )
    assert term.proc.wait(timeout=60) == 0
    assert wait_until(lambda: "kill -TERM" in term.output(), timeout=10)
    said = term.output()
    pid = int(said.split("as pid ")[1].split(",")[0])
    assert f"tail -f {log}" in said and f"kill -TERM {pid}" in said
    term.close()
    assert wait_until(lambda: _gone(pid), timeout=240), "the detached watchdog did not finish"
    assert contract.read_exit_status(ckpt)["exit_code"] == 0 and (ckpt / ck.FINAL_MODEL).is_file()
    text = log.read_text()
    assert "step       4/4" in text and "supervise.watchdog: trainer exited with 0 (finished)" in text


def test_detach_needs_a_log_file(capsys):
    assert W_cli.main(["--detach", "--", "x"]) == 2
    assert "--detach needs --log-file" in capsys.readouterr().err


def test_the_trainer_does_not_outlive_its_watchdog(demo_data, tmp_path):
    """SIGKILL the watchdog (nothing can forward anything): the trainer notices and stops with a checkpoint."""
    ckpt = tmp_path / "c"
    cmd = [sys.executable, "-m", "x1_pretrain.watchdog", "--", *train_cmd(demo_data, ckpt, 2000, *SMALL_BATCH)]
    proc = start(cmd, tmp_path / "out.log")
    wait_for(lambda: progress_step(ckpt) >= 2, proc=proc)
    trainer = json.loads((ckpt / "progress.json").read_text())["pid"]
    proc.kill()
    proc.wait()
    assert wait_until(lambda: _gone(trainer), timeout=60), "the trainer kept running without its watchdog"
    status = contract.read_exit_status(ckpt)
    assert status["exit_code"] == 75 and (ckpt / "latest").exists()


def test_a_crash_loop_is_not_relaunched_forever(tmp_path):
    log = tmp_path / "events.jsonl"
    code = run_watchdog(fake_trainer(tmp_path, [1, 1, 1, 1, 0], progress=False), "--log-file", str(log))
    assert code == 1 and len(calls(tmp_path)) == 2  # the relaunch got no further: stop there
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events][-2:] == ["crash_loop", "still_billing"]


def test_a_store_down_at_start_is_relaunched_with_backoff_alerted_once_and_never_a_crash_loop(tmp_path, monkeypatch):
    """Exit 8: the trainer waited checkpoint.remote_wait_min for its store and ended before any step. Three such
    starts in a row (each would be a crash loop with exit 1: no step, no new checkpoint) are relaunched with the
    growing backoff, alerted once, and the run goes on when the store is back."""
    hook = JsonServer()
    hook.route("/hook", {"ok": True})
    monkeypatch.setenv("X1_SLACK_WEBHOOK_URL", hook.base + "/hook")
    events = tmp_path / "events.jsonl"
    try:
        assert run_watchdog(fake_trainer(tmp_path, [8, 8, 8, 0], progress=False), "--events-file", str(events)) == 0
    finally:
        hook.close()
    assert len(calls(tmp_path)) == 4 and all("--resume-from-latest" in c["argv"] for c in calls(tmp_path)[1:])
    log = [json.loads(line) for line in events.read_text().splitlines()]
    kinds = [e["event"] for e in log]
    assert "crash_loop" not in kinds and kinds.count("store_unavailable") == 3
    assert [e["backoff_s"] for e in log if e["event"] == "relaunched"] == [0.01, 0.02, 0.04]
    assert [e["reason"] for e in log if e["event"] == "relaunched"] == [W.describe_exit(8)] * 3
    texts = [b["text"] for b in hook.bodies("/hook")]
    assert len([t for t in texts if "checkpoint store cannot be reached (exit 8)" in t]) == 1, texts
    # the same starts with exit 1 stop at the second one: the crash-loop rule is for starts that trained
    (tmp_path / "calls.jsonl").unlink()
    assert run_watchdog(fake_trainer(tmp_path, [1, 1, 1, 0], progress=False)) == 1 and len(calls(tmp_path)) == 2
    (tmp_path / "calls.jsonl").unlink()
    assert run_watchdog(fake_trainer(tmp_path, [8, 1, 8, 1, 0], progress=False)) == 0 and len(calls(tmp_path)) == 5


def test_a_stop_during_the_backoff_is_not_relaunched_and_says_the_machine_bills(tmp_path):
    """SIGTERM while the watchdog waits 60 s before a relaunch: it ends the wait at once, starts nothing, exits
    75 and records that nothing runs."""
    events = tmp_path / "events.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "60",
        "--events-file",
        str(events),
        "--",
        *fake_trainer(tmp_path, [1, 0]),
    ]
    proc = start(cmd, tmp_path / "out.log")
    try:
        wait_for(
            lambda: "relaunching with --resume-from-latest in 60.0 s" in (tmp_path / "out.log").read_text(),
            proc=proc,
            timeout=60,
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 75  # the backoff's 60 s were not waited out
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(calls(tmp_path)) == 1
    kinds = [json.loads(line)["event"] for line in events.read_text().splitlines()]
    assert kinds[-1] == "still_billing" and "relaunched" not in kinds


def test_a_crash_loop_is_two_starts_at_the_same_step_with_no_new_checkpoint(tmp_path):
    """Crashes at other steps, or with a new checkpoint between them, are relaunched (with the backoff) up to
    --max-restarts; only a start that ends where the previous one ended, on the same checkpoint, is a loop."""
    places = [(20, 10), (15, 15), (15, 15)]  # the second start wrote a new checkpoint (15) and crashed earlier
    assert run_watchdog(fake_trainer(tmp_path, [1, 1, 1], places=places)) == 1
    assert len(calls(tmp_path)) == 3  # started 3 times: the third ended where the second did
    (tmp_path / "calls.jsonl").unlink()
    places = [(20, 10), (30, 10), (25, 10), (40, 10)]  # the same checkpoint, but each start ends elsewhere
    assert run_watchdog(fake_trainer(tmp_path, [1, 1, 1, 1], places=places), "--max-restarts", "3") == 1
    assert len(calls(tmp_path)) == 4  # the restart limit ended it, not the crash-loop rule


@pytest.mark.parametrize("code", [0, 2, 5, 6])
def test_an_ending_that_leaves_the_machine_billing_alerts_with_the_rate(tmp_path, code):
    hook = JsonServer()
    hook.route("/hook", {"ok": True})
    budget = tmp_path / "budget.json"
    _budget(budget, 3.0)
    try:
        os.environ["X1_SLACK_WEBHOOK_URL"] = hook.base + "/hook"
        assert (
            run_watchdog(
                fake_trainer(tmp_path, [code]), "--budget-cap-usd", "35", "--budget-curr-cost-uri", str(budget)
            )
            == code
        )
    finally:
        del os.environ["X1_SLACK_WEBHOOK_URL"]
        hook.close()
    (text,) = [b["text"] for b in hook.bodies("/hook")]
    assert f"still bills (exit {code})" in text and "$1.10/h ($26.40 a day)" in text


def lambda_api(tmp_path, monkeypatch, remote: str = "s3://x1-runs/unused") -> tuple[JsonServer, list[str]]:
    """A Lambda API on 127.0.0.1 with one instance (inst-a), and the watchdog flags that end its bill (the
    bundle to ``remote``)."""
    api = JsonServer()
    api.route(
        "/api/v1/instances",
        {
            "data": [
                {
                    "id": "inst-a",
                    "status": "active",
                    "instance_type": {"name": "gpu_1x_a100", "price_cents_per_hour": 110},
                }
            ]
        },
    )
    api.route("/api/v1/instance-operations/terminate", {"data": {"terminated_instances": [{"id": "inst-a"}]}})
    monkeypatch.setenv("LAMBDA_API_KEY", "sk-test")
    return api, [
        "--terminate-on-exit",
        "lambda",
        "--provider-base-url",
        api.base,
        "--export-to",
        str(tmp_path / "out"),
        "--bundle-remote",
        remote,
    ]


def test_terminate_on_exit_after_a_crash_loop_ends_the_run_at_its_checkpoint_exports_and_terminates(
    demo_data, tmp_path, monkeypatch, s3, s3env
):
    """A real run's checkpoints, then a trainer that crashes twice at the same place: with --terminate-on-exit
    the run ends at its last complete checkpoint (final files, MLflow FINISHED), is exported and uploaded with
    that checkpoint to the real S3 server, and only then is the instance terminated."""
    from mlflow import MlflowClient

    from x1_pretrain import train

    ckpt = tmp_path / "ckpt"
    assert train.main(train_cmd(demo_data, ckpt, 4, *SMALL_BATCH, ckpt_every=2)[3:]) == 0
    client, (run,) = run_info(ckpt)
    client.set_terminated(run.info.run_id, "FAILED")  # as a crashed trainer leaves it
    (ckpt / ck.FINAL_MODEL).unlink()
    (ckpt / "exit_status.json").unlink()
    api, end = lambda_api(tmp_path, monkeypatch, s3env + "/bundle")
    prefix, seen = s3env.split("/", 3)[3], []

    def terminate(body: bytes) -> tuple[int, dict]:
        seen.append(set(s3.keys(prefix)))  # what the bucket held when the request came
        return 200, {"data": {"terminated_instances": [{"id": "inst-a"}]}}

    api.route("/api/v1/instance-operations/terminate", terminate)
    try:
        assert run_watchdog(fake_trainer(tmp_path, [1, 1], places=[(5, 4), (5, 4)]), *end) == 1
        assert api.bodies("/api/v1/instance-operations/terminate") == [{"instance_ids": ["inst-a"]}]
    finally:
        api.close()
    assert (tmp_path / "out" / "manifest.json").is_file() and (ckpt / ck.FINAL_MODEL).is_file()
    (there,) = seen
    assert f"{prefix}/bundle/manifest.json" in there and f"{prefix}/bundle/x1-dir.json" in there
    assert f"{prefix}/bundle/checkpoint/model.safetensors" in there and f"{prefix}/bundle/checkpoint/DONE" in there
    assert MlflowClient(f"sqlite:///{ckpt}/mlflow.db").get_run(run.info.run_id).info.status == "FINISHED"


def test_a_stopped_trainer_cannot_spend_past_the_cap(demo_data, tmp_path):
    """The trainer is SIGSTOPped (its own watcher cannot run); the spend passes the cap; the watchdog reads the
    budget itself, ends the trainer's process group, alerts and exits 4 without relaunching."""
    hook = JsonServer()
    hook.route("/hook", {"ok": True})
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    _budget(budget, 10.0)
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--budget-poll-s",
        "0.3",
        "--budget-kill-grace-s",
        "2",
        "--log-file",
        str(tmp_path / "events.jsonl"),
        "--",
        *train_cmd(
            demo_data,
            ckpt,
            2000,
            "--budget-cap-usd",
            "35",
            "--budget-curr-cost-uri",
            str(budget),
            "--budget-check-every-min",
            "60",
            "--force-launch",
            *SMALL_BATCH,
        ),
    ]
    env = {**os.environ, "X1_SLACK_WEBHOOK_URL": hook.base + "/hook"}
    with open(tmp_path / "out.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: progress_step(ckpt) >= 2, proc=proc)
        trainer = json.loads((ckpt / "progress.json").read_text())["pid"]
        os.kill(trainer, signal.SIGSTOP)
        _budget(budget, 36.0)
        crossed = time.monotonic()
        assert proc.wait(timeout=60) == 4, (tmp_path / "out.log").read_text()[-3000:]
        took = time.monotonic() - crossed
    finally:
        if proc.poll() is None:
            proc.kill()
        hook.close()
    assert took < 0.3 + 2 + 5, f"{took:.1f} s"  # one poll + the kill grace (+ slack for a busy machine)
    assert wait_until(lambda: _gone(trainer), timeout=10)
    out = (tmp_path / "out.log").read_text()
    assert "ending the trainer's process group" in out and "relaunching with" not in out
    assert any("budget stop (exit 4)" in (b or {}).get("text", "") for b in hook.bodies("/hook"))
    assert contract.read_exit_status(ckpt)["exit_code"] == 4


def _budget(path, spent: float) -> None:
    from datetime import datetime, timezone

    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "spent_usd": spent,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 1,
                "projected_total_usd": spent,
                "fixed_usd": {"disk_usd": 0, "egress_usd": 0},
                "last_update_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )
    tmp.replace(path)


def test_the_watchdog_ends_the_bill_only_when_the_run_is_over(tmp_path, monkeypatch):
    api, end = lambda_api(tmp_path, monkeypatch)
    try:
        # a crash loop with nothing to export: the instance stays (its disk may hold the only copy) and says so
        assert run_watchdog(fake_trainer(tmp_path, [1, 1], progress=False), *end) == 1
        assert api.bodies("/api/v1/instance-operations/terminate") == []
        # a budget stop without a checkpoint is: the export fails (nothing to export), the bill ends anyway
        (tmp_path / "calls.jsonl").unlink()
        assert run_watchdog(fake_trainer(tmp_path, [4]), *end) == 4
        assert api.bodies("/api/v1/instance-operations/terminate") == [{"instance_ids": ["inst-a"]}]
    finally:
        api.close()
    assert W_cli.main(["--terminate-on-exit", "lambda", "--", "x"]) == 2  # --export-to is required


def test_terminate_on_exit_without_a_remote_is_refused_at_launch(tmp_path, capsys, monkeypatch):
    """The export would sit on the instance's own disk, which the termination destroys: refused, and why."""
    monkeypatch.setenv("LAMBDA_API_KEY", "sk-test")
    train = [sys.executable, "-m", "x1_pretrain.train", "--ckpt-dir", str(tmp_path / "c")]
    assert W_cli.main(["--terminate-on-exit", "lambda", "--export-to", str(tmp_path / "out"), "--", *train]) == 2
    err = capsys.readouterr().err
    assert "instance's own disk" in err and "--bundle-remote" in err and "--ckpt-remote" in err
    assert (
        W_cli.main(
            [
                "--terminate-on-exit",
                "lambda",
                "--export-to",
                str(tmp_path / "out"),
                "--bundle-remote",
                "not-a-url",
                "--",
                *train,
            ]
        )
        == 2
    )
    assert "expected s3://BUCKET/PREFIX" in capsys.readouterr().err
    # the train command's --ckpt-remote is the default remote: PREFIX/bundle
    end = W_cli.options(
        W_cli.build_parser().parse_args(["--terminate-on-exit", "lambda", "--export-to", "o"]),
        [*train, "--ckpt-remote", "s3://x1-runs/exp/"],
    ).end_of_bill
    assert end is not None and end.bundle_remote == "s3://x1-runs/exp/bundle"


def test_a_node_without_rank_0_is_not_taken_for_a_crash_loop(tmp_path):
    """On another machine of a multi-node job the steps are on rank 0's disk: its watchdog sees each start's
    trainer record an exit (as rank 1) but no progress, and must relaunch instead of calling it a crash loop
    (rank 0's node's watchdog judges that). A start that records nothing twice is still one."""
    script = tmp_path / "node1.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys
        os.environ["RANK"] = "1"
        from x1_pretrain.core.contract import write_exit_status
        state = {str(tmp_path / "calls.jsonl")!r}
        n = sum(1 for _ in open(state)) if os.path.exists(state) else 0
        with open(state, "a") as f:
            f.write("{{}}\\n")
        code = [1, 1, 1, 0][n]
        write_exit_status(None, code, "rank 0's exit code" if code == 0 else "another rank stopped answering")
        sys.exit(code)
    """)
    )
    assert run_watchdog([sys.executable, str(script), "--ckpt-dir", str(tmp_path / "ckpt")]) == 0
    assert len(calls(tmp_path)) == 4


STATUS_PROBE = textwrap.dedent("""
    import json, os, stat, sys
    from pathlib import Path
    from x1_pretrain.core.contract import EXIT_STATUS_ENV, write_exit_status
    write_exit_status(None, 3, "probe: a budget stop")   # what rank 0 records for its watchdog
    path = Path(os.environ[EXIT_STATUS_ENV])
    Path(sys.argv[-1]).joinpath("probe.json").write_text(json.dumps(
        {"path": str(path), "mode": stat.S_IMODE(path.stat().st_mode)}))
""")


def test_the_exit_status_file_lives_in_the_runs_dir_for_its_owner_only(tmp_path):
    """The trainer's exit code reaches its watchdog through a file in the checkpoint dir (created 0600 under a
    permissive umask), not a predictable name in /tmp; the watchdog acts on it and removes it at the end."""
    ckpt = tmp_path / "run" / "ckpt"  # not there yet: the watchdog makes it
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--",
        sys.executable,
        "-c",
        STATUS_PROBE,
        "--ckpt-dir",
        str(ckpt),
    ]
    r = subprocess.run(
        ["sh", "-c", 'umask 000; exec "$@"', "sh", *cmd], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 3, r.stderr[-2000:]  # the child exited 0; its recorded 3 is what counts
    assert "recorded exit 3" in r.stderr
    probe = json.loads((ckpt / "probe.json").read_text())
    status = ckpt.resolve() / probe["path"].rsplit("/", 1)[-1]
    assert probe["path"] == str(status) and status.name.startswith(".watchdog-") and probe["mode"] == 0o600
    assert not status.exists()  # the watchdog's own file goes with it


def test_at_warning_level_the_watchdog_still_says_what_ends_stalls_or_bills(capsys, tmp_path):
    """--log-level warning keeps the lines that matter: a crash loop, a give-up, a non-zero final exit, a full
    disk, a budget kill, the still-billing note; a relaunch and a clean finish are INFO and drop out."""
    from x1_pretrain.core.log import setup

    wd = W.Watchdog(["x", "--ckpt-dir", str(tmp_path / "c")], W.WatchdogOptions())
    setup("warning", info_to="stderr")
    wd.log("trainer exited with 75; relaunching", event="relaunched")
    wd.log("trainer exited with 0 (finished); not relaunching", event="final_exit", exit_code=0)
    for kind in sorted(W.WARNING_EVENTS):
        wd.log(f"line of {kind}", event=kind)
    wd.log("trainer exited with 5 (diverged); not relaunching", event="final_exit", exit_code=5)
    err = capsys.readouterr().err
    assert "relaunching" not in err.replace("not relaunching", "") and "(finished)" not in err
    shown = [x.split(" supervise.watchdog: ", 1)[1] for x in err.splitlines()]
    assert shown == [f"line of {k}" for k in sorted(W.WARNING_EVENTS)] + [
        "trainer exited with 5 (diverged); not relaunching"
    ]
    assert all(" WARNING supervise.watchdog: " in x for x in err.splitlines())
