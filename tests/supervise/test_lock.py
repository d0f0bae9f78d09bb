"""One trainer per checkpoint dir, with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from x1_pretrain.supervise.lock import LOCK_FILE, RunLock

from ..procs import progress_step, start, train_cmd, train_here, wait_for


def test_a_second_trainer_on_the_same_dir_exits_2_naming_the_holder(demo_data, tmp_path, capsys):
    """The holder is a real trainer process; the second trainer and the one that takes the stale lock over run
    in this process (the lock is an flock on its own open file: a second open conflicts in any process)."""
    ckpt = tmp_path / "c"
    first = start(train_cmd(demo_data, ckpt, 2000), tmp_path / "a.log")
    try:
        wait_for(lambda: progress_step(ckpt) >= 1, proc=first)
        capsys.readouterr()
        assert train_here(train_cmd(demo_data, ckpt, 10, "--resume-from-latest")) == 2
        err = capsys.readouterr().err
        assert f"in use by another trainer: pid {first.pid}" in err and "double the cost" in err
        assert "Traceback" not in err
        assert first.poll() is None  # the first one trains on, undisturbed
    finally:
        first.kill()
        first.wait()
    # the holder died without cleaning up (SIGKILL): the next trainer takes the stale lock over and says so
    holder = json.loads((ckpt / LOCK_FILE).read_text())
    assert holder["pid"] == first.pid
    assert train_here(train_cmd(demo_data, ckpt, 1, "--resume-from-latest", "--allow-config-change")) == 0, (
        capsys.readouterr().err[-2000:]
    )
    assert f"took over a stale lock on {ckpt}: pid {first.pid}" in capsys.readouterr().out
    assert (ckpt / LOCK_FILE).read_text() == ""  # a clean exit leaves no holder behind


def test_the_lock_is_exclusive_between_processes_and_released(tmp_path):
    a = RunLock(tmp_path)
    a.acquire()
    code = (
        "import sys; from pathlib import Path; from x1_pretrain.supervise.lock import RunLock\n"
        "from x1_pretrain.core.errors import X1Error\n"
        "try:\n    RunLock(Path(sys.argv[1])).acquire()\nexcept X1Error as e:\n    print(e); sys.exit(2)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and f"pid {os.getpid()}" in r.stdout
    a.release()
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
