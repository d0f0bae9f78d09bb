"""Faults that must lose no work: a disk that fills at a checkpoint, a tracking server that never answers
under a SIGTERM, a relaunch the launch gate refuses. Real trainer processes and real signals where the behaviour is
a process's (a SIGTERM, its exit within the grace), the trainer in this process otherwise; real servers."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
import time

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import contract
from x1_pretrain.supervise.watchdog import should_relaunch

from ..conftest import REPO
from ..failing_disk import failing
from ..procs import SMALL_BATCH, progress_step, run_info, start, train_cmd, train_here, wait_for
from ..servers import JsonServer, SilentServer

FAILING_DISK = [sys.executable, str(REPO / "tests" / "failing_disk.py")]


def on_failing_disk(spec: str, cmd: list[str]) -> list[str]:
    """The same trainer command, run with checkpoint writes failing (ENOSPC) at the steps in ``spec``."""
    return [*FAILING_DISK, spec, "--", *cmd[cmd.index("x1_pretrain.train") + 1 :]]


def leftovers(ckpt) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def test_a_checkpoint_that_fails_is_reported_at_once_and_training_goes_on_and_a_refused_relaunch_still_ends_well(
    demo_data, tmp_path
):
    """ENOSPC at the step-5 write: the console says so at once, MLflow is tagged, the alert reaches a real
    webhook; the half-written dir is gone, the step-10 checkpoint is written on schedule, and a SIGTERM
    after all that is still a clean interrupt (75), not a usage error.

    Then that interrupted run (75) is relaunched when the price has jumped: the launch gate refuses it (exit 3)
    and, as for a mid-run budget stop, the final files are written from the newest checkpoint and the MLflow run
    is closed FINISHED with the reason, so export_run has something to export."""
    ckpt, hook = tmp_path / "c", JsonServer()
    hook.route("/hook", {"ok": True})
    log = tmp_path / "a.log"
    cmd = on_failing_disk("5", train_cmd(demo_data, ckpt, 400, *SMALL_BATCH, ckpt_every=5))
    env = {**os.environ, "X1_SLACK_WEBHOOK_URL": hook.base + "/hook"}
    proc = start(cmd, log, env)
    try:
        # step_10 or a later one (a loaded machine may poll only after step_15 landed): the window never closes
        wait_for(
            lambda: (ck.read_latest(ckpt) or "") >= "step_0000010" and progress_step(ckpt) >= 12, proc=proc, timeout=180
        )
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        hook.close()
    text = log.read_text()
    assert code == 75, text[-3000:]
    line = next(x for x in text.splitlines() if "checkpoint step_0000005 (periodic) could not be written" in x)
    assert "No space left on device" in line and "there is no complete checkpoint yet" in line
    # reported when it happened (the async write takes well under 5 steps here), not at the next checkpoint
    assert text.index(line) < text.index(f"step {10:>7}/")
    assert leftovers(ckpt) == [] and not (ckpt / "step_0000005").exists()
    assert "checkpoint step_0000010 (periodic):" in text  # the next one, on schedule
    stop = ck.read_latest(ckpt)
    assert int(stop.split("_")[1]) >= 12 and contract.read_exit_status(ckpt)["exit_code"] == 75
    assert ck.verify(ckpt / stop)[1] is None
    _, runs = run_info(ckpt)
    tags = runs[0].data.tags
    assert tags["checkpoint_failures"] == "1" and "step_0000005 (periodic)" in tags["checkpoint_failed"]
    alerts = [b for b in hook.bodies("/hook") if "step_0000005 FAILED" in json.dumps(b)]
    assert len(alerts) == 1 and "No space left on device" in json.dumps(alerts[0])

    # the relaunch of that interrupted run, refused by the launch gate (in this process: no signal in it)
    budget = tmp_path / "budget.json"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    budget.write_text(
        json.dumps(
            {
                "spent_usd": 1.0,
                "rate_usd_per_hr": 30.0,
                "hours_elapsed": 0.1,
                "projected_total_usd": 1.0,
                "last_update_utc": now,
            }
        )
    )
    cmd = train_cmd(
        demo_data,
        ckpt,
        400,
        *SMALL_BATCH,
        "--resume-from-latest",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-expected-step-s",
        "60",
        ckpt_every=5,
        seed=False,
    )
    assert train_here(cmd) == 3
    assert (ckpt / ck.FINAL_MODEL).exists() and (ckpt / ck.FINAL_OPTIM).exists()
    assert ck.read_latest(ckpt) == stop
    _, runs = run_info(ckpt)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    reason = runs[0].data.tags["end_reason"]
    assert runs[0].data.tags["exit_code"] == "3" and reason.startswith("launch refused: the rate is $30.00/h")
    assert re.search(r"--total-steps \d+ --allow-config-change, or --budget-fit --allow-config-change", reason)


def test_a_final_checkpoint_that_cannot_be_written_exits_7_and_keeps_the_last_good_one(
    demo_data, tmp_path, monkeypatch, capsys
):
    """The disk fills from step 6 on: the periodic step-6 write fails and training goes on; the final write
    at step 7 fails too, so the run ends with exit 7 (relaunched by the watchdog and SkyPilot), not 0, and
    step_3 stays the latest complete checkpoint with nothing half-written beside it. (In this process, with
    tests/failing_disk.py's failing write: the exit code is the trainer's return value.)"""
    fails, real = failing("6+"), ck._fill_step_dir

    def fill(tmp, snap):
        if not fails(snap.step):
            return real(tmp, snap)
        (tmp / ck.MODEL_FILE).write_bytes(b"\0" * 4096)  # part of the write landed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / ck.OPTIM_FILE))

    monkeypatch.setattr(ck, "_fill_step_dir", fill)
    ckpt = tmp_path / "c"
    code = train_here(train_cmd(demo_data, ckpt, 7, *SMALL_BATCH, ckpt_every=3))
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert code == 7, out[-3000:]
    assert "checkpoint step_0000006 (periodic) could not be written" in out
    assert "step_0000003 stays the latest complete checkpoint" in out
    assert "Exit 7: the watchdog relaunches from the last complete checkpoint (step_0000003)" in out
    assert ck.read_latest(ckpt) == "step_0000003" and leftovers(ckpt) == []
    assert not (ckpt / ck.FINAL_MODEL).exists()
    assert contract.read_exit_status(ckpt)["exit_code"] == 7 and should_relaunch(7)
    _, runs = run_info(ckpt)
    assert runs[0].data.tags["exit_code"] == "7" and runs[0].data.tags["checkpoint_failures"] == "2"


def test_a_sigterm_ends_within_the_grace_whatever_the_tracking_server_does(demo_data, tmp_path):
    """The tracking server accepts connections and never answers (each request would wait 60 s). From the
    SIGTERM the checkpoint is written first, then MLflow gets what is left of --stop-grace-s: the process
    exits 75 inside the grace, and the metrics it could not deliver are spilled for the resume."""
    ckpt, silent = tmp_path / "c", SilentServer()
    grace = 4.0
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_TIMEOUT": "60", "X1_MLFLOW_START_TIMEOUT_S": "1"}
    cmd = train_cmd(
        demo_data,
        ckpt,
        400,
        "--mlflow-uri",
        silent.url,
        "--stop-grace-s",
        str(grace),
        "--set",
        "checkpoint.async_save=false",
        *SMALL_BATCH,
        seed=False,
    )
    log = tmp_path / "a.log"
    proc = start(cmd, log, env)
    try:
        wait_for(lambda: progress_step(ckpt) >= 3, proc=proc, timeout=180)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        silent.close()
    text = log.read_text()
    assert code == 75, text[-3000:]
    # + the interpreter's own exit (torch, MLflow) after the deadline guard stood down, slower on a loaded machine;
    # the default grace of 25 s keeps 5 s of a cloud's 30 s notice for it
    assert took < grace + 4.0, f"{took:.1f} s from SIGTERM to exit (grace {grace:g} s)"
    stop = ck.read_latest(ckpt)
    assert stop is not None and ck.verify(ckpt / stop)[0]["step"] >= 3
    spilled = list(ckpt.glob("mlflow-undelivered-*.jsonl"))
    assert spilled and "train/loss" in spilled[0].read_text()
    assert "unreachable" in text
