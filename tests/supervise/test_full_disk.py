"""A real full disk under a running trainer: the checkpoint dir is a small tmpfs, filled to the last byte once the
first checkpoint is on it. The trainer goes on where it can (progress record, MLflow, ledger), ends with exit 7
where it cannot (the final checkpoint), keeps the last complete checkpoint ``latest``; the watchdog waits for
space instead of relaunching into the full disk, and relaunches once the filler is deleted."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import contract
from x1_pretrain.core.fileio import free_bytes

from ..procs import SMALL_BATCH, children, start, train_cmd, wait_for
from ..servers import JsonServer
from ..trainer.test_budget_control import budget_json

# the tiny model's checkpoint is ~40 MB, its final files ~65 MB: room for the resumed run's last checkpoint
DISK_MB = 200


IN_NAMESPACE = "X1_TEST_IN_USER_NAMESPACE"  # set for the re-run of a test under `unshare -rm`


def _mount(where: Path) -> str | None:
    """Mount a DISK_MB tmpfs on ``where``: None when it worked, else why not."""
    try:
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def _rerun_in_a_namespace(request, why: str):
    """Without root: the same test again in a user and mount namespace of its own (``unshare -rm``: root there,
    so it may mount a tmpfs, and the trainer it starts sees it); that run's outcome is this test's. Where that
    cannot run either, a skip, or a failure under CI=true: a CI must not pass without ever filling a disk."""
    if not os.environ.get(IN_NAMESPACE) and shutil.which("unshare"):
        cmd = [
            "unshare",
            "-rm",
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            request.node.nodeid,
        ]
        r = subprocess.run(
            cmd,
            cwd=request.config.rootpath,
            env={**os.environ, IN_NAMESPACE: "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        tail = r.stdout.strip().splitlines()[-1:] or [r.stderr.strip()]
        if r.returncode == 0 and " passed" in tail[0]:
            pytest.skip(f"no tmpfs mount for this user ({why}): the test ran inside `unshare -rm` and passed")
        if " failed" in tail[0] or " error" in tail[0]:
            pytest.fail(f"inside `unshare -rm`:\n{(r.stdout + r.stderr)[-4000:]}")
        why = f"{why}; `unshare -rm` did not help ({(tail[0] or r.stderr.strip())[:200]})"
    message = f"cannot mount a tmpfs here ({why}): the full-disk tests need root, CAP_SYS_ADMIN or `unshare -rm`"
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true: {message}")
    pytest.skip(message)


@pytest.fixture
def small_disk(request, tmp_path):
    """A real filesystem of DISK_MB MB (tmpfs), mounted for the test and unmounted after it; without root the
    test runs again under ``unshare -rm`` (``_rerun_in_a_namespace``)."""
    where = tmp_path / "disk"
    where.mkdir()
    why = _mount(where)
    if why is not None:
        _rerun_in_a_namespace(request, why)
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # a process still holds a file


def fill(disk: Path) -> Path:
    """Write a filler file until the filesystem refuses with ENOSPC: not a byte is left."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (b"\0" * (1 << 20), b"\0" * 4096, b"\0"):
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    finally:
        os.close(fd)
    assert free_bytes(disk) == 0
    return filler


def leftovers(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def fast_close() -> dict[str, str]:
    return {**os.environ, "X1_MLFLOW_CLOSE_TIMEOUT_S": "3"}


@contextlib.contextmanager
def running(cmd: list[str], log: Path, env: dict[str, str] | None = None):
    """A real process writing ``log``, killed at the end of the block if it is still there."""
    proc = start(cmd, log, env if env is not None else fast_close())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def fill_after_first_checkpoint(proc, ckpt: Path, disk: Path) -> tuple[Path, str]:
    """Wait for the first checkpoint, fill the disk: (the filler, the checkpoint ``latest`` names then). The trainer
    (``proc`` or the one under it) is stopped (SIGSTOP) while the disk fills, so however short its steps, the fill
    is complete before its next checkpoint."""
    wait_for(
        lambda: ck.read_latest(ckpt) is not None and (contract.read_progress(ckpt) or {}).get("pid"),
        proc=proc,
        timeout=120,
    )
    trainer = contract.read_progress(ckpt)["pid"]
    os.kill(trainer, signal.SIGSTOP)
    try:
        filler = fill(disk)
    finally:
        os.kill(trainer, signal.SIGCONT)
    return filler, str(ck.read_latest(ckpt))


def test_a_disk_that_fills_under_the_trainer_ends_with_exit_7_and_the_last_good_checkpoint(
    demo_data, small_disk, tmp_path
):
    """Filled right after the first checkpoint: every later write meets ENOSPC. The progress record is skipped
    with one warning an episode, the periodic checkpoint fails and training goes on, the final one cannot be
    written: exit 7 (not 1), ``latest`` names the checkpoint from before the fill, which verifies, and no
    partial step dir or temp file is left on the disk."""
    ckpt, log = small_disk / "c", tmp_path / "train.log"
    with running(train_cmd(demo_data, ckpt, 16, *SMALL_BATCH, ckpt_every=5), log) as proc:
        _, kept = fill_after_first_checkpoint(proc, ckpt, small_disk)
        code = proc.wait(timeout=120)
    text = log.read_text()
    assert code == 7, text[-3000:]
    failed = [
        x for x in text.splitlines() if "could not be written to" in x and " ERROR   launch.session: checkpoint" in x
    ]
    assert failed and all("No space left on device" in x for x in failed), text[-3000:]
    assert any("(final) could not be written" in x for x in failed)
    assert f"Exit 7: the watchdog relaunches from the last complete checkpoint ({kept})" in text
    assert "Traceback" not in text, text[-3000:]
    skipped = [x for x in text.splitlines() if "progress.json could not be written" in x]
    assert 1 <= len(skipped) <= len(failed) + 1, skipped  # one warning an episode, not one a step
    assert ck.read_latest(ckpt) == kept and ck.verify(ckpt / kept)[1] is None
    assert all(ck.verify(p)[1] is None for _, p in ck.list_step_dirs(ckpt))  # no partial step dir
    assert leftovers(ckpt) == [] and not (ckpt / ck.FINAL_MODEL).exists()
    # the MLflow store (mlflow.db) shares the full disk: the last metrics cannot reach it, and their spill file
    # cannot be written either; it is not left cut on the disk, and the log says what was lost
    undelivered = [x for x in text.splitlines() if "metrics could not be delivered" in x]
    assert len(undelivered) == 1 and "could not be saved either" in undelivered[0], text[-3000:]
    assert list(ckpt.glob("mlflow-undelivered-*.jsonl")) == []


def test_a_trainer_started_on_a_full_disk_exits_7_not_1(demo_data, small_disk, tmp_path):
    """A relaunch into a disk that is already full: the first write it cannot skip ends it with exit 7 and one
    line naming the disk, no traceback."""
    ckpt = small_disk / "c"
    cmd = train_cmd(demo_data, ckpt, 10, *SMALL_BATCH)
    fill(small_disk)
    r = subprocess.run(cmd, capture_output=True, text=True, env=fast_close(), timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 7, out[-3000:]
    assert f"ERROR   launch.session: the disk of {ckpt} is full" in out and "No space left on device" in out
    assert "Traceback" not in out and not ck.list_step_dirs(ckpt)


def test_the_budget_guard_keeps_working_on_a_full_disk(demo_data, small_disk, tmp_path):
    """The ledger cannot be written once the disk is full: one warning, and the guard goes on from its memory:
    the spend passing the cap still ends the run (exit 4)."""
    ckpt, log, budget = small_disk / "c", tmp_path / "train.log", tmp_path / "budget.json"
    budget_json(budget, 10.0)
    cmd = train_cmd(
        demo_data,
        ckpt,
        2000,
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-check-every-min",
        "0.005",
        "--force-launch",
        *SMALL_BATCH,
        ckpt_every=5,
    )
    with running(cmd, log) as proc:
        fill_after_first_checkpoint(proc, ckpt, small_disk)
        wait_for(lambda: "budget warning: cannot write" in log.read_text(), proc=proc, timeout=60)
        budget_json(budget, 36.0)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 4, text[-3000:]
    assert text.count("budget warning: cannot write") == 1, text[-3000:]
    assert "spent $36" in text and "Traceback" not in text


def test_the_watchdog_waits_for_space_alerts_once_and_relaunches_when_it_is_back(demo_data, small_disk, tmp_path):
    """The trainer ends with exit 7 on the full disk: the watchdog does not relaunch; it says it waits (console,
    event, one alert with the free and the needed MB) and runs no trainer meanwhile. Once the filler is deleted
    it relaunches with --resume-from-latest and the run finishes from the checkpoint written before the fill."""
    ckpt, log, events, hook = small_disk / "c", tmp_path / "wd.log", tmp_path / "events.jsonl", JsonServer()
    hook.route("/hook", {"ok": True})
    train = train_cmd(demo_data, ckpt, 10, *SMALL_BATCH, ckpt_every=5)
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--events-file",
        str(events),
        "--backoff-s",
        "0.1",
        "--disk-poll-s",
        "0.1",
        "--disk-margin-mb",
        "1",
        "--",
        *train,
    ]
    try:
        with running(cmd, log, {**fast_close(), "X1_SLACK_WEBHOOK_URL": hook.base + "/hook"}) as wd:
            filler, kept = fill_after_first_checkpoint(wd, ckpt, small_disk)
            wait_for(lambda: "disk full on" in log.read_text(), proc=wd, timeout=120)
            line = next(x for x in log.read_text().splitlines() if "disk full on" in x)
            assert f"disk full on {ckpt}: 0 MB free, a checkpoint needs " in line and "MB; waiting" in line
            assert children(wd.pid) == []  # no trainer runs on the full disk
            wait_for(lambda: any("disk full on" in json.dumps(b) for b in hook.bodies("/hook")), timeout=30)
            filler.unlink()
            code = wd.wait(timeout=150)
    finally:
        hook.close()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "relaunching" in text.split(line, 1)[1] and "restart 1: trainer back" in text
    logged = [json.loads(x) for x in events.read_text().splitlines()]
    full = [e for e in logged if e.get("event") == "disk_full"]
    assert len(full) == 1 and full[0]["free_mb"] == 0 and full[0]["need_mb"] > 1
    assert any(e.get("event") == "disk_space_back" for e in logged)
    alerts = [b for b in hook.bodies("/hook") if "disk full on" in json.dumps(b)]
    assert len(alerts) == 1, alerts
    assert kept == "step_0000005" and f"resuming from {ckpt / kept} at step 5" in text
    assert ck.read_latest(ckpt) == "step_0000010" and ck.verify(ckpt / "step_0000010")[1] is None
    assert (ckpt / ck.FINAL_MODEL).is_file()


def test_a_budget_stop_ends_the_wait_for_space(small_disk, tmp_path):
    """While the watchdog waits on the full disk its budget line keeps reading: the spend passes the cap, the
    wait ends with exit 4 and the trainer is never started again."""
    ckpt, budget, starts, log = small_disk / "c", tmp_path / "budget.json", tmp_path / "starts", tmp_path / "wd.log"
    ckpt.mkdir()
    trainer = tmp_path / "trainer.py"  # a trainer that ends as one does on a full disk (exit 7)
    trainer.write_text(f"import sys\nopen({str(starts)!r}, 'a').write('x')\nsys.exit(7)\n")
    budget_json(budget, 10.0)
    fill(small_disk)
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--disk-poll-s",
        "0.1",
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-poll-s",
        "0.2",
        "--",
        sys.executable,
        str(trainer),
        "--ckpt-dir",
        str(ckpt),
    ]
    with running(cmd, log, dict(os.environ)) as wd:
        wait_for(lambda: "disk full on" in log.read_text(), proc=wd, timeout=60)
        budget_json(budget, 36.0)
        code = wd.wait(timeout=60)
    text = log.read_text()
    assert code == 4, text[-3000:]
    after = text.split("disk full on", 1)[1]
    assert starts.read_text() == "x" and "MB): relaunching" not in after and "budget: " in after
