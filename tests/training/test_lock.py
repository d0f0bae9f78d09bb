"""One trainer per checkpoint dir, with real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from x1_pretrain.training.lock import LOCK_FILE, RunLock

from ..conftest import REPO
from ..procs import progress_step, start, train_cmd, wait_for


def test_a_second_trainer_on_the_same_dir_exits_2_naming_the_holder(demo_data, tmp_path):
    ckpt = tmp_path / "c"
    first = start(train_cmd(demo_data, ckpt, 2000), tmp_path / "a.log")
    try:
        wait_for(lambda: progress_step(ckpt) >= 1, proc=first)
        r = subprocess.run(train_cmd(demo_data, ckpt, 10, "--resume-from-latest"), cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2
        assert f"in use by another trainer: pid {first.pid}" in r.stderr and "double the cost" in r.stderr
        assert "Traceback" not in r.stderr
        assert first.poll() is None                       # the first one trains on, undisturbed
    finally:
        first.kill()
        first.wait()
    # the holder died without cleaning up (SIGKILL): the next trainer takes the stale lock over and says so
    holder = json.loads((ckpt / LOCK_FILE).read_text())
    assert holder["pid"] == first.pid
    r = subprocess.run(train_cmd(demo_data, ckpt, 1, "--resume-from-latest", "--allow-config-change"), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"took over a stale lock on {ckpt}: pid {first.pid}" in r.stdout
    assert (ckpt / LOCK_FILE).read_text() == ""           # a clean exit leaves no holder behind


def test_the_lock_is_exclusive_between_processes_and_released(tmp_path):
    a = RunLock(tmp_path)
    a.acquire()
    code = ("import sys; from pathlib import Path; from x1_pretrain.training.lock import RunLock\n"
            "from x1_pretrain.core.errors import X1Error\n"
            "try:\n    RunLock(Path(sys.argv[1])).acquire()\nexcept X1Error as e:\n    print(e); sys.exit(2)\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and f"pid {os.getpid()}" in r.stdout
    a.release()
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout

