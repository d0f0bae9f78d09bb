"""The watchdog's policy and loop: which exits are relaunched, backoff, crash loops, restart records,
signal forwarding, the budget's second line and the end of the bill; the command and its rules are
documented in ``watchdog.py``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..budget.guard import Decision
from ..budget.outside import OutsideGuard
from ..budget.terminate import EndOfBill, end_the_bill
from ..core import redact
from ..core.errors import (
    EXIT_BUDGET_CHECKPOINT,
    EXIT_BUDGET_NOW,
    EXIT_CHECKPOINT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
)
from .checkpoint import EXIT_STATUS_ENV, read_exit_status, read_latest, read_progress, write_exit_status
from .signals import WATCHDOG_PID_ENV

RELAUNCH = {EXIT_INTERRUPTED, EXIT_UNEXPECTED, EXIT_CHECKPOINT_FAILED}
FOR_GOOD = {EXIT_OK, EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW}   # after these, --terminate-on-exit ends the bill
MEANING = {0: "finished", 1: "unexpected failure", 2: "bad usage/config/data", 3: "budget stop (checkpointed)",
           4: "budget stop (no checkpoint)", 5: "diverged", 6: "throughput below floor",
           7: "the final or stop checkpoint could not be written (the last good one is kept)",
           75: "interrupted after a checkpoint", 130: "aborted by a second SIGINT"}
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return MEANING.get(code, f"exit {code}")


def should_relaunch(code: int) -> bool:
    """Relaunch after 75, 7, 1 or death by a signal (negative returncode, or 128+N from a shell)."""
    return code in RELAUNCH or code < 0 or (128 < code < 160 and code != 130)


def with_resume(cmd: list[str]) -> list[str]:
    return cmd if "--resume-from-latest" in cmd else [*cmd, "--resume-from-latest"]


def flag_of(cmd: list[str], flag: str) -> str | None:
    """The value of ``--flag V`` or ``--flag=V`` in a command line."""
    for i, a in enumerate(cmd):
        if a == flag and i + 1 < len(cmd):
            return cmd[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def ckpt_dir_of(cmd: list[str]) -> Path:
    return Path(flag_of(cmd, "--ckpt-dir") or "checkpoints")


@dataclass(frozen=True)
class BudgetLine:
    """The watchdog's own budget check (the second line): where the spend is read and the cap."""

    source: str
    cap_usd: float
    poll_s: float = 60.0
    kill_grace_s: float = 10.0


@dataclass(frozen=True)
class WatchdogOptions:
    max_restarts: int = 20
    backoff_s: float = 5.0
    max_backoff_s: float = 60.0
    log_file: Path | None = None
    budget: BudgetLine | None = None
    end_of_bill: EndOfBill | None = None
    alerter: Any = None


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


@dataclass
class _Exit:
    """How one child ended: its code and how far it got (for the crash-loop rule)."""

    code: int
    step: int | None
    checkpoint_step: int | None
    reached: int = field(init=False)

    def __post_init__(self) -> None:
        self.reached = max(s for s in (self.step, self.checkpoint_step, -1) if s is not None)


class Watchdog:
    def __init__(self, cmd: list[str], opts: WatchdogOptions) -> None:
        self.cmd, self.opts = cmd, opts
        self.ckpt_dir = ckpt_dir_of(cmd)
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_signal: int | None = None
        self.restarts: list[Restart] = []
        self.status_file = Path(tempfile.gettempdir()) / f"x1-watchdog-{os.getpid()}-exit.json"
        self.budget_kill: Decision | None = None

    def log(self, msg: str, **event: Any) -> None:
        print(f"[watchdog] {msg}", file=sys.stderr, flush=True)
        if self.opts.log_file is not None and event:
            with open(self.opts.log_file, "a") as f:
                f.write(json.dumps({"time_unix": time.time(), **event}) + "\n")

    def _forward(self, signum: int, _frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signum
            how = " as SIGTERM (the terminal closed?)" if signum == signal.SIGHUP else ""
            self.log(f"{signal.Signals(signum).name} received: forwarding to the trainer{how} and waiting for its "
                     "checkpoint")
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _start(self, cmd: list[str], restart_no: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "X1_RESTART_COUNT": str(restart_no), EXIT_STATUS_ENV: str(self.status_file),
               WATCHDOG_PID_ENV: str(os.getpid())}
        # Its own session: a terminal's Ctrl-C reaches the watchdog only, which forwards it once (twice would be a
        # second SIGINT: an abort without a checkpoint). The trainer watches X1_WATCHDOG_PID so it dies with us.
        return subprocess.Popen(cmd, env=env, start_new_session=True)

    def _latency(self, child: subprocess.Popen[bytes], started_at: float, since: float,
                 timeout_s: float = 3600) -> float | None:
        """Seconds from the previous exit to the start of the new trainer's first step, or None. The progress
        file must have been written by a process that started after this child (under torchrun its pid is
        rank 0's, not the child's)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline and child.poll() is None:
            p = read_progress(self.ckpt_dir)
            if p and p.get("first_step_started_unix") and float(p.get("started_unix") or 0) >= started_at - 1:
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

    # -- the budget's second line --
    def _over_the_cap(self, decision: Decision) -> None:
        """Called on the guard's thread: end the trainer's process group now; it is never relaunched."""
        self.budget_kill = decision
        child = self.child
        self.log(f"budget: {decision.reason} (read by the watchdog itself): ending the trainer's process group",
                 event="budget_kill", spent_usd=decision.spent_usd)
        if child is None or child.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a stopped trainer must see the SIGTERM
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                return
        try:
            child.wait(timeout=self.opts.budget.kill_grace_s if self.opts.budget else 10.0)
        except subprocess.TimeoutExpired:
            self.log("the trainer did not end within the grace: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    def _guard(self) -> OutsideGuard | None:
        b = self.opts.budget
        return OutsideGuard(b.source, b.cap_usd, self.ckpt_dir, b.poll_s, self._over_the_cap) if b else None

    def run(self) -> int:
        for s in FORWARDED:
            signal.signal(s, self._forward)
        guard = self._guard()
        if guard is not None:
            guard.start()
            self.log(f"budget: reading {redact.url(guard.source)} every {guard.poll_s:g} s; the trainer's process "
                     f"group ends when the spend passes ${guard.cap_usd:.2f}")
        try:
            code = self._supervise()
        finally:
            if guard is not None:
                guard.stop()
        if code in FOR_GOOD and self.opts.end_of_bill is not None and self.stop_signal is None:
            end_the_bill(self.opts.end_of_bill, code, self.log, self.opts.alerter)
        return code

    def _supervise(self) -> int:
        cmd, pending, exited_at, failures, previous = self.cmd, None, 0.0, 0, None
        while True:
            started_at = time.time()
            self.child = self._start(cmd, len(self.restarts))
            if pending is not None:
                pending.downtime_s = round(time.time() - exited_at, 3)
                pending.relaunch_latency_s = lat = self._latency(self.child, started_at, exited_at)
                self.log(f"restart {pending.number}: trainer back"
                         + (f", first step began {lat:.1f} s after the exit" if lat is not None else ""),
                         event="relaunched", **asdict(pending))
                pending = None
            code = self._trainer_code(self.child.wait(), started_at)
            exited_at = time.time()
            final = self._final(code)
            if final is not None:
                return final
            now = self._exit_now(code)
            if previous is not None and now.reached <= previous.reached:
                self.log(f"trainer exited with {code} ({describe_exit(code)}) at step {now.step} again, with no "
                         f"progress since the last start (step {previous.reached}): a crash loop; not relaunching "
                         "(fix the cause, then resume with --resume-from-latest)", event="crash_loop",
                         exit_code=code, step=now.reached)
                return code if code >= 0 else 128 - code
            previous = now
            failures = failures + 1 if code != EXIT_INTERRUPTED else 0
            pending = self._record_restart(code, now, failures)
            time.sleep(pending.backoff_s)
            if self.stop_signal is not None or self.budget_kill is not None:
                self.log("stop requested during the backoff; not relaunching")
                return EXIT_BUDGET_NOW if self.budget_kill is not None else EXIT_INTERRUPTED
            cmd = with_resume(self.cmd)

    def _final(self, code: int) -> int | None:
        """The exit code to leave with, or None to consider a relaunch."""
        if self.budget_kill is not None:
            reason = f"budget: {self.budget_kill.reason} (stopped by the watchdog)"
            with contextlib.suppress(OSError):
                write_exit_status(self.ckpt_dir, EXIT_BUDGET_NOW, reason)
            self.log(f"trainer ended (exit {code}) by the watchdog's budget stop; not relaunching",
                     event="final_exit", exit_code=EXIT_BUDGET_NOW)
            if self.opts.alerter is not None:
                from .budget import stop_message

                subject, body = stop_message(EXIT_BUDGET_NOW, reason, self.opts.budget.cap_usd if self.opts.budget
                                             else 0.0, self.budget_kill.spent_usd, None)
                self.opts.alerter.send_within(subject, body)
            return EXIT_BUDGET_NOW
        if self.stop_signal is not None:
            self.log(f"trainer exited with {code} ({describe_exit(code)}) after the forwarded signal; "
                     "not relaunching", event="stopped", exit_code=code)
            return code if code >= 0 else EXIT_INTERRUPTED
        if not should_relaunch(code):
            self.log(f"trainer exited with {code} ({describe_exit(code)}); not relaunching",
                     event="final_exit", exit_code=code, restarts=len(self.restarts))
            return code if code >= 0 else 128 - code
        if len(self.restarts) >= self.opts.max_restarts:
            self.log(f"trainer exited with {code} ({describe_exit(code)}); --max-restarts {self.opts.max_restarts} "
                     "reached, giving up", event="gave_up", exit_code=code)
            return code if code >= 0 else 128 - code
        return None

    def _exit_now(self, code: int) -> _Exit:
        progress = read_progress(self.ckpt_dir) or {}
        latest = read_latest(self.ckpt_dir)
        ckpt_step = int(latest.split("_")[1]) if latest and latest.startswith("step_") else None
        step = progress.get("step") if isinstance(progress.get("step"), int) else None
        return _Exit(code, step, ckpt_step)

    def _record_restart(self, code: int, now: _Exit, failures: int) -> Restart:
        backoff = min(self.opts.backoff_s * (2 ** max(failures - 1, 0)), self.opts.max_backoff_s)
        # progress.json is written every log step, so the stop's own checkpoint can be newer than it
        lost = max(now.step - now.checkpoint_step, 0) if now.step is not None and now.checkpoint_step is not None \
            else now.step
        pending = Restart(len(self.restarts) + 1, code, describe_exit(code), now.step, now.checkpoint_step, lost,
                          backoff)
        self.restarts.append(pending)
        latest = f"step_{now.checkpoint_step:07d}" if now.checkpoint_step is not None else "none"
        self.log(f"trainer exited with {code} ({describe_exit(code)}) at step {now.step}; latest checkpoint {latest} "
                 f"(about {lost if lost is not None else '?'} steps to redo); relaunching with --resume-from-latest "
                 f"in {backoff:.1f} s (restart {pending.number}/{self.opts.max_restarts})")
        return pending

