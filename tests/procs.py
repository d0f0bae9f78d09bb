"""Helpers for tests that run the trainer as a real process and signal it."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from .conftest import FAST, REPO, TINY, seed_store


def train_cmd(
    data: Path,
    ckpt: Path,
    steps: int,
    *extra: str,
    ckpt_every: int = 1000,
    log_every: int = 1,
    eval_every: int = 1000,
    seed: bool = True,
) -> list[str]:
    """The trainer's command line; ``seed`` gives a new ckpt dir a migrated MLflow store (conftest)."""
    if seed and "--mlflow-uri" not in extra:
        seed_store(ckpt)
    return [
        sys.executable,
        "-m",
        "x1_pretrain.train",
        "--config",
        str(TINY),
        "--data-dir",
        str(data),
        "--ckpt-dir",
        str(ckpt),
        "--total-steps",
        str(steps),
        "--ckpt-every",
        str(ckpt_every),
        "--log-every",
        str(log_every),
        "--eval-every",
        str(eval_every),
        *FAST,
        *extra,
    ]


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_for(pred, timeout: float = 120.0, every: float = 0.005, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before the condition held")
        time.sleep(every)
    raise AssertionError("timed out waiting")


def progress_step(ckpt: Path) -> int:
    try:
        return json.loads((ckpt / "progress.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return -1


def losses(ckpt: Path) -> dict[int, float]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ckpt.resolve()}/mlflow.db")
    exp = client.get_experiment_by_name("x1-pretraining")
    (run,) = client.search_runs([exp.experiment_id])
    hist = client.get_metric_history(run.info.run_id, "train/loss")
    out: dict[int, float] = {}
    for m in hist:
        assert out.get(m.step, m.value) == m.value, f"two different losses logged at step {m.step}"
        out[m.step] = m.value
    return out


def run_info(ckpt: Path):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ckpt.resolve()}/mlflow.db")
    exp = client.get_experiment_by_name("x1-pretraining")
    runs = client.search_runs([exp.experiment_id])
    return client, runs


class Terminal:
    """A command run on a real pseudo-terminal as its controlling terminal (the process leads a new session, as a
    login shell's job would). ``close`` closes the terminal as a closed SSH session does: the kernel sends SIGHUP
    to the session's leader and every later write to the terminal fails with EIO."""

    _ADOPT = (
        "import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
        "os.execvp(sys.argv[1], sys.argv[1:])"
    )

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        import os
        import pty
        import threading

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self._ADOPT, *cmd],
            cwd=REPO,
            env=env,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        self._chunks: list[bytes] = []
        self._closing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        import os
        import select

        while not self._closing.is_set():
            ready, _, _ = select.select([self.master], [], [], 0.05)  # never blocked in a read at close time
            if not ready:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every slave side is gone (the process ended)
                return
            if not data:
                return
            self._chunks.append(data)

    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def close(self) -> None:
        """Close the terminal: the reader stops first, so the close is the last reference to the master."""
        import os

        self._closing.set()
        self._reader.join(timeout=10)
        assert not self._reader.is_alive()
        os.close(self.master)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (any of its threads), from /proc/*/stat."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def train_here(cmd: list[str]) -> int:
    """The trainer command ``cmd`` (from ``train_cmd``) run in this process: ``train.main`` on its arguments, with
    no interpreter start-up or torch import (for runs whose behaviour does not need a process of their own)."""
    from x1_pretrain import train

    return train.main(cmd[cmd.index("x1_pretrain.train") + 1 :])


# Four sequences a step in two micro-batches (FAST's batch is 16): a quarter of the LM head's work a step, for the
# runs whose behaviour does not depend on the batch (signals, the watchdog, faults, the budget line). Passed after
# FAST (``train_cmd(..., *SMALL_BATCH)``), so it wins.
SMALL_BATCH = ["--set", "train.batch_size=4", "--set", "train.micro_batch_size=2"]
