from __future__ import annotations

import json
import signal
import sys
import textwrap

import pytest

from x1_pretrain import watchdog as W_cli
from x1_pretrain.training import watchdog as W

from ..procs import progress_step, run_info, start, train_cmd, wait_for


def fake_trainer(tmp_path, codes: list[int], progress: bool = True) -> list[str]:
    """A real child process that exits with the next code of ``codes`` and records its argv."""
    script = tmp_path / "fake_train.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, signal, sys
        state = {str(tmp_path / 'calls.jsonl')!r}
        n = sum(1 for _ in open(state)) if os.path.exists(state) else 0
        with open(state, "a") as f:
            f.write(json.dumps({{"argv": sys.argv[1:], "restart": os.environ.get("X1_RESTART_COUNT")}}) + "\\n")
        ckpt = {str(tmp_path / 'ckpt')!r}
        os.makedirs(ckpt, exist_ok=True)
        if {progress!r}:  # each start gets further than the last, as a run that crashes now and then does
            with open(os.path.join(ckpt, "progress.json"), "w") as f:
                json.dump({{"pid": os.getpid(), "step": 10 * (n + 1)}}, f)
        code = {codes!r}[n]
        if code < 0:
            os.kill(os.getpid(), -code)
        sys.exit(code)
    """))
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
    assert [e["reason"] for e in relaunched] == ["unexpected failure", "interrupted after a checkpoint",
                                                  "killed by SIGKILL"]
    assert all(e["downtime_s"] is not None for e in relaunched)
    assert events[-1]["event"] == "final_exit" and events[-1]["restarts"] == 3


def test_gives_up_after_max_restarts(tmp_path):
    assert run_watchdog(fake_trainer(tmp_path, [1, 1, 1, 1]), "--max-restarts", "2") == 1
    assert len(calls(tmp_path)) == 3


def test_backoff_doubles_on_consecutive_crashes():
    wd = W.Watchdog(["x"], W.WatchdogOptions(5, 1.0, 60.0))
    assert wd.opts.backoff_s == 1.0 and W.should_relaunch(-15) and W.should_relaunch(137) and not W.should_relaunch(130)
    assert W.with_resume(["a", "--resume-from-latest"]) == ["a", "--resume-from-latest"]
    assert W.ckpt_dir_of(["t", "--ckpt-dir=/x"]).as_posix() == "/x"


def test_usage_errors(capsys):
    assert W_cli.main(["--max-restarts", "1"]) == 2
    assert W_cli.main(["--"]) == 2


def test_preempted_trainer_is_resumed_and_the_curve_is_continuous(demo_data, tmp_path):
    """A real trainer under the watchdog gets SIGTERM mid-run (a spot preemption): it checkpoints, exits
    75, the watchdog relaunches it with --resume-from-latest, and the MLflow run has every step once."""
    ckpt = tmp_path / "c"
    log = tmp_path / "events.jsonl"
    cmd = [sys.executable, "-m", "x1_pretrain.watchdog", "--backoff-s", "0.5", "--log-file", str(log), "--",
           *train_cmd(demo_data, ckpt, 16, ckpt_every=1000)]
    proc = start(cmd, tmp_path / "out.log")
    wait_for(lambda: progress_step(ckpt) >= 5, proc=proc)
    trainer_pid = json.loads((ckpt / "progress.json").read_text())["pid"]
    import os

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
    assert steps == list(range(1, 17))


def test_sigterm_to_the_watchdog_is_forwarded_and_not_relaunched(demo_data, tmp_path):
    ckpt = tmp_path / "c"
    cmd = [sys.executable, "-m", "x1_pretrain.watchdog", "--backoff-s", "0.1", "--",
           *train_cmd(demo_data, ckpt, 500)]
    proc = start(cmd, tmp_path / "out.log")
    wait_for(lambda: progress_step(ckpt) >= 2, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    out = (tmp_path / "out.log").read_text()
    assert "forwarding to the trainer" in out and "not relaunching" in out
    assert (ckpt / "latest").exists()
