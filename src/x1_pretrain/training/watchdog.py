"""The watchdog's policy and loop: which exits are relaunched, backoff, restart records and signal
forwarding; the command and its rules are documented in ``watchdog.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..core.errors import EXIT_INTERRUPTED, EXIT_UNEXPECTED
from .checkpoint import EXIT_STATUS_ENV, read_exit_status, read_latest, read_progress

RELAUNCH = {EXIT_INTERRUPTED, EXIT_UNEXPECTED}
MEANING = {0: "finished", 1: "unexpected failure", 2: "bad usage/config/data", 3: "budget stop (checkpointed)",
           4: "budget stop (no checkpoint)", 5: "diverged", 6: "throughput below floor",
           75: "interrupted after a checkpoint", 130: "aborted by a second SIGINT"}


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return MEANING.get(code, f"exit {code}")


def should_relaunch(code: int) -> bool:
    """Relaunch after 75, 1 or death by a signal (negative returncode, or 128+N from a shell)."""
    return code in RELAUNCH or code < 0 or (128 < code < 160 and code != 130)


def with_resume(cmd: list[str]) -> list[str]:
    return cmd if "--resume-from-latest" in cmd else [*cmd, "--resume-from-latest"]


def ckpt_dir_of(cmd: list[str]) -> Path:
    for i, a in enumerate(cmd):
        if a == "--ckpt-dir" and i + 1 < len(cmd):
            return Path(cmd[i + 1])
        if a.startswith("--ckpt-dir="):
            return Path(a.split("=", 1)[1])
    return Path("checkpoints")


@dataclass
class Restart:
    number: int
    exit_code: int
    reason: str
    last_step: int | None
    checkpoint_step: int | None
    steps_lost: int | None
    backoff_s: float
    downtime_s: float | None = None
    relaunch_latency_s: float | None = None


class Watchdog:
    def __init__(self, cmd: list[str], max_restarts: int, backoff_s: float, max_backoff_s: float,
                 log_file: Path | None) -> None:
        self.cmd = cmd
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.ckpt_dir = ckpt_dir_of(cmd)
        self.log_file = log_file
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_signal: int | None = None
        self.restarts: list[Restart] = []
        self.status_file = Path(tempfile.gettempdir()) / f"x1-watchdog-{os.getpid()}-exit.json"

    def log(self, msg: str, **event: Any) -> None:
        print(f"[watchdog] {msg}", file=sys.stderr, flush=True)
        if self.log_file is not None and event:
            with open(self.log_file, "a") as f:
                f.write(json.dumps({"time_unix": time.time(), **event}) + "\n")

    def _forward(self, signum: int, _frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            self.log(f"{signal.Signals(signum).name} received: forwarding to the trainer and waiting for its "
                     "checkpoint")
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def _start(self, cmd: list[str], restart_no: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "X1_RESTART_COUNT": str(restart_no), EXIT_STATUS_ENV: str(self.status_file)}
        # Its own session: a terminal's Ctrl-C reaches the watchdog only, which forwards it once. Otherwise
        # the trainer would get it twice (terminal + forward), and a second SIGINT aborts without a checkpoint.
        return subprocess.Popen(cmd, env=env, start_new_session=True)

    def _latency(self, child: subprocess.Popen[bytes], since: float, timeout_s: float = 3600) -> float | None:
        """Seconds from the previous exit to the start of the new trainer's first step, or None."""
        deadline = time.time() + timeout_s
        while time.time() < deadline and child.poll() is None:
            p = read_progress(self.ckpt_dir)
            if p and p.get("pid") == child.pid and p.get("first_step_started_unix"):
                return float(p["first_step_started_unix"]) - since
            time.sleep(0.2)
        return None

    def _trainer_code(self, code: int, started_at: float) -> int:
        """The trainer's own exit code: under torchrun the process we ran reports 1 for any worker failure,
        so rank 0's recorded status (written after this child started) is the truth."""
        status = read_exit_status(self.status_file) or read_exit_status(self.ckpt_dir)
        if status is None or float(status.get("time_unix", 0)) < started_at - 1 or status["exit_code"] == code:
            return code
        self.log(f"the command exited with {code}; the trainer (rank 0) recorded exit {status['exit_code']} "
                 f"({describe_exit(status['exit_code'])}): acting on that")
        return int(status["exit_code"])

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        cmd = self.cmd
        pending: Restart | None = None
        exited_at = 0.0
        failures = 0
        while True:
            started_at = time.time()
            self.child = self._start(cmd, len(self.restarts))
            if pending is not None:
                pending.downtime_s = round(time.time() - exited_at, 3)
                pending.relaunch_latency_s = self._latency(self.child, exited_at)
                lat = pending.relaunch_latency_s
                self.log(f"restart {pending.number}: trainer back"
                         + (f", first step began {lat:.1f} s after the exit" if lat is not None else ""),
                         event="relaunched", **asdict(pending))
                pending = None
            code = self.child.wait()
            exited_at = time.time()
            code = self._trainer_code(code, started_at)
            if self.stop_signal is not None:
                self.log(f"trainer exited with {code} ({describe_exit(code)}) after the forwarded signal; "
                         "not relaunching", event="stopped", exit_code=code)
                return code if code >= 0 else EXIT_INTERRUPTED
            if not should_relaunch(code):
                self.log(f"trainer exited with {code} ({describe_exit(code)}); not relaunching",
                         event="final_exit", exit_code=code, restarts=len(self.restarts))
                return code if code >= 0 else 128 - code
            if len(self.restarts) >= self.max_restarts:
                self.log(f"trainer exited with {code} ({describe_exit(code)}); --max-restarts {self.max_restarts} "
                         "reached, giving up", event="gave_up", exit_code=code)
                return code if code >= 0 else 128 - code
            failures = failures + 1 if code != EXIT_INTERRUPTED else 0
            backoff = min(self.backoff_s * (2 ** max(failures - 1, 0)), self.max_backoff_s)
            progress = read_progress(self.ckpt_dir) or {}
            last_step = progress.get("step")
            latest = read_latest(self.ckpt_dir)
            ckpt_step = int(latest.split("_")[1]) if latest and latest.startswith("step_") else None
            # progress.json is written every log step, so the stop's own checkpoint can be newer than it
            lost = max(last_step - ckpt_step, 0) if isinstance(last_step, int) and ckpt_step is not None \
                else last_step
            pending = Restart(len(self.restarts) + 1, code, describe_exit(code), last_step, ckpt_step, lost, backoff)
            self.restarts.append(pending)
            self.log(f"trainer exited with {code} ({describe_exit(code)}) at step {last_step}; latest checkpoint "
                     f"{latest or 'none'} (about {lost if lost is not None else '?'} steps to redo); relaunching "
                     f"with --resume-from-latest in {backoff:.1f} s (restart {pending.number}/{self.max_restarts})")
            time.sleep(backoff)
            if self.stop_signal is not None:
                self.log("stop requested during the backoff; not relaunching")
                return EXIT_INTERRUPTED
            cmd = with_resume(self.cmd)
