"""The watchdog's policy and loop: which exits are relaunched, backoff, crash loops, restart records,
signal forwarding, the budget's second line and the end of the bill; the command and its rules are
documented in ``watchdog.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..budget import ledger
from ..budget.guard import Decision
from ..budget.outside import OutsideGuard
from ..budget.source import read_source
from ..ckpt.checkpoint import find_latest_complete, read_latest
from ..core import redact
from ..core.contract import (
    EXIT_BUDGET_CHECKPOINT,
    EXIT_BUDGET_NOW,
    EXIT_CHECKPOINT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STATUS,
    EXIT_STATUS_ENV,
    EXIT_STORE_UNAVAILABLE,
    LOG_FILE_ENV,
    RESTART_COUNT_ENV,
    WATCHDOG_PID_ENV,
    ckpt_dir_of,
    flag_of,
    read_exit_status,
    read_progress,
    with_resume,
    write_exit_status,
)
from ..core.fileio import dir_bytes, free_bytes, says_disk_full
from ..core.log import as_log
from .options import WatchdogOptions
from .policy import (
    CRASH_LOOP,
    FOR_GOOD,
    GAVE_UP,
    NOT_CRASHES,
    STOPPED,
    ExitPoint,
    Restart,
    describe_exit,
    of_this_start,
    should_relaunch,
)
from .terminate import end_the_bill

_log = logging.getLogger(__name__)
_say = as_log(_log)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# events whose line is a warning: the run stopped, stalled or failed, or a machine bills with nothing running
WARNING_EVENTS = frozenset(
    {"budget_kill", "crash_loop", "gave_up", "disk_full", "store_unavailable", "no_rendezvous", "still_billing"}
)
DISK_REMINDER_S = 600.0  # while the watchdog waits for space on a full disk, a log line this often


def free_mb(free: int | None) -> str:
    return "?" if free is None else f"{free / 1e6:,.0f}"


class Watchdog:
    def __init__(self, cmd: list[str], opts: WatchdogOptions) -> None:
        self.cmd, self.opts = cmd, opts
        self.ckpt_dir = ckpt_dir_of(cmd)
        self.child: subprocess.Popen[bytes] | None = None
        self.stop_signal: int | None = None
        self.restarts: list[Restart] = []
        # the trainer's exit status for this watchdog, in the run's own dir (0600): no name in a shared /tmp
        self.status_file = self.ckpt_dir.absolute() / f".watchdog-{os.getpid()}-exit.json"
        self._made_dirs: list[Path] = []  # made for it, deepest first: removed at the end if still empty
        self.budget_kill: Decision | None = None
        self.ending: str | None = None  # CRASH_LOOP, GAVE_UP or STOPPED; None: the trainer's code says it

    def cleanup(self) -> None:
        """Remove the status file, and the dirs made for it that nothing but the exit record was written into (a
        trainer that stopped at a usage error leaves no checkpoint dir behind, as without a watchdog)."""
        self.status_file.unlink(missing_ok=True)
        for d in self._made_dirs:
            with contextlib.suppress(OSError):
                if d == self.status_file.parent and {p.name for p in d.iterdir()} == {EXIT_STATUS}:
                    (d / EXIT_STATUS).unlink()
            try:
                d.rmdir()
            except OSError:  # not empty: the run's
                break

    def log(self, msg: str, **event: Any) -> None:
        """A console line (never raises: ``core.console`` diverts a closed terminal) and, with ``event``, a JSON
        line in ``--events-file``. The event says the level: what ends or stalls the run, or keeps a machine
        billing, is a WARNING (``--log-level warning`` shows it), the rest INFO."""
        kind, code = event.get("event"), event.get("exit_code")
        if kind in WARNING_EVENTS or (kind == "final_exit" and code not in (None, 0)):
            _log.warning(msg)
        else:
            _say(msg)
        if self.opts.events_file is not None and event:
            try:
                with open(self.opts.events_file, "a") as f:
                    f.write(json.dumps({"time_unix": time.time(), **event}) + "\n")
            except OSError as e:  # a full disk must not end the supervision
                _log.warning(f"cannot append to {self.opts.events_file} ({e})")

    def _forward(self, signum: int, _frame: Any) -> None:
        """A signal handler: it only records the stop and sends it on. The child may be between two starts, so
        ``_launch`` sends a recorded stop again to the child it has just started. The note is a raw write (a
        print here could land inside the main thread's own write to stderr), and a closed terminal cannot stop
        it (OSError)."""
        first = self.stop_signal is None
        if first:
            self.stop_signal = signum
        self._send_stop(signum)
        if first:
            how = " as SIGTERM (the terminal closed?)" if signum == signal.SIGHUP else ""
            with contextlib.suppress(OSError):
                os.write(
                    2,
                    f"[watchdog] {signal.Signals(signum).name} received: forwarded to the trainer{how}; "
                    "waiting for its checkpoint\n".encode(),
                )

    def _send_stop(self, signum: int) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def _launch(self, cmd: list[str], restart_no: int) -> subprocess.Popen[bytes]:
        """Start the trainer; a stop or a budget kill that came while it was starting reaches it too (a second
        SIGTERM is harmless; a stored SIGINT is sent as SIGTERM, since two SIGINTs would abort)."""
        self.child = child = self._start(cmd, restart_no)
        if self.stop_signal is not None:
            self._send_stop(signal.SIGTERM)
        if self.budget_kill is not None:
            self._end_group(child)
        return child

    def _start(self, cmd: list[str], restart_no: int) -> subprocess.Popen[bytes]:
        home = self.status_file.parent
        if not home.is_dir():  # the status file's home (a dir the trainer cannot make is its own error to report)
            missing = [d for d in (home, *home.parents) if not d.exists()]
            with contextlib.suppress(OSError):
                home.mkdir(parents=True, exist_ok=True)
                self._made_dirs += missing
        env = {
            **os.environ,
            RESTART_COUNT_ENV: str(restart_no),
            EXIT_STATUS_ENV: str(self.status_file),
            WATCHDOG_PID_ENV: str(os.getpid()),
        }
        if self.opts.log_file is not None:  # where the trainer's output goes once the terminal is gone
            env[LOG_FILE_ENV] = str(self.opts.log_file.resolve())
        # Its own session: a terminal's Ctrl-C reaches the watchdog only, which forwards it once (twice would be a
        # second SIGINT: an abort without a checkpoint). The trainer watches X1_WATCHDOG_PID so it dies with us.
        return subprocess.Popen(cmd, env=env, start_new_session=True)

    def _latency(
        self, child: subprocess.Popen[bytes], started_at: float, since: float, timeout_s: float = 3600
    ) -> float | None:
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
        status = next(
            (
                s
                for s in (read_exit_status(self.status_file), read_exit_status(self.ckpt_dir))
                if of_this_start(s, started_at)
            ),
            None,
        )
        if status is None or status["exit_code"] == code:
            return code
        self.log(
            f"the command exited with {code}; the trainer (rank 0) recorded exit {status['exit_code']} "
            f"({describe_exit(status['exit_code'])}): acting on that"
        )
        return int(status["exit_code"])

    def _recorded_since(self, started_at: float) -> dict[str, Any] | None:
        """The exit status a trainer of this start recorded in the file this watchdog owns, or None."""
        status = read_exit_status(self.status_file)
        return status if of_this_start(status, started_at) else None

    def _no_rendezvous(self, code: int, recorded: dict[str, Any] | None) -> None:
        """Say it when a multi-node torchrun ended before any trainer of this node recorded an exit: its
        rendezvous did not form (torchrun's own message is a traceback). Each start waits torchrun's
        join_timeout; the second such start in a row is a crash loop, which ends the watchdog."""
        nodes = flag_of(self.cmd, "--nnodes")
        torchrun = any(a.endswith("torchrun") or a == "torch.distributed.run" for a in self.cmd[:3])
        if code == 0 or not torchrun or nodes in (None, "1", "1:1") or recorded is not None:
            return
        endpoint = (
            flag_of(self.cmd, "--rdzv-endpoint")
            or flag_of(self.cmd, "--rdzv_endpoint")
            or f"{flag_of(self.cmd, '--master-addr') or flag_of(self.cmd, '--master_addr')}:"
            f"{flag_of(self.cmd, '--master-port') or flag_of(self.cmd, '--master_port') or 29500}"
        )
        self.log(
            f"no trainer of this node recorded an exit: most likely torchrun's rendezvous of {nodes} nodes at "
            f"{endpoint} did not form within its timeout (--rdzv-conf join_timeout=S for c10d, timeout=S "
            "for a static --node-rank; 600 s by default). Every node must run the same command and reach that "
            "port on the head node; a node whose watchdog has ended will not come back. Else the trainer was "
            "killed before it could record (the OOM killer, an NCCL abort): torchrun's own error above says "
            "which",
            event="no_rendezvous",
            exit_code=code,
            endpoint=endpoint,
        )

    # -- the budget's second line --
    def _over_the_cap(self, decision: Decision) -> None:
        """Called on the guard's thread: end the trainer's process group now; it is never relaunched."""
        self.budget_kill = decision
        child = self.child
        self.log(
            f"budget: {decision.reason} (read by the watchdog itself): ending the trainer's process group",
            event="budget_kill",
            spent_usd=decision.spent_usd,
        )
        self._end_group(child)

    def _end_group(self, child: subprocess.Popen[bytes] | None) -> None:
        """SIGTERM (and SIGCONT) to the trainer's process group, SIGKILL after the kill grace."""
        if child is None or child.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGCONT):  # SIGCONT: a stopped trainer must see the SIGTERM
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                return
        try:
            child.wait(timeout=self.opts.budget_line.kill_grace_s if self.opts.budget_line else 10.0)
        except subprocess.TimeoutExpired:
            self.log("warning: the trainer did not end within the grace: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    def _guard(self) -> OutsideGuard | None:
        b = self.opts.budget_line
        return OutsideGuard(b.curr_cost_uri, b.cap_usd, self.ckpt_dir, b.poll_s, self._over_the_cap) if b else None

    def run(self) -> int:
        for s in FORWARDED:
            signal.signal(s, self._forward)
        guard = self._guard()
        if guard is not None:
            guard.start()
            self.log(
                f"budget: reading {redact.url(guard.source)} every {guard.poll_s:g} s; the trainer's process "
                f"group ends when the spend passes ${guard.cap_usd:.2f}"
            )
        try:
            code = self._supervise()
        finally:
            if guard is not None:
                guard.stop()
        self._after(code)
        return code

    def _after(self, code: int) -> None:
        """Nothing runs any more: end the bill when asked and the run allows it, else say that the machine bills."""
        end = self.opts.end_of_bill
        if end is not None and self.stop_signal is None and (code in FOR_GOOD or self.ending in (CRASH_LOOP, GAVE_UP)):
            if self.ending in (CRASH_LOOP, GAVE_UP):
                self._end_at_last_checkpoint(code)
            final = find_latest_complete(self.ckpt_dir, self.log)  # goes off the machine with the bundle
            end = end if end.run_dir is not None else dataclasses.replace(end, run_dir=self.ckpt_dir)  # its run id
            end_the_bill(end, code, self.log, self.opts.alerter, final.path if final else None)  # it alerts
            return
        if code in (EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW):
            return  # a budget stop: its alert (the trainer's or the watchdog's) says to terminate the instance
        self._alert_still_billing(code)

    def _end_at_last_checkpoint(self, code: int) -> None:
        """Before terminating after a crash loop or the restart limit: the run ends at its newest complete
        checkpoint (final files, the MLflow run FINISHED with the reason), so export_run can save it."""
        if self.opts.end_run is None:
            self.log("the run is not ended at its last checkpoint: this watchdog was given no way to end it")
            return
        why = (
            f"the watchdog gave up ({self.ending.replace('_', ' ') if self.ending else 'ended'}): the run ends at "
            "its last complete checkpoint"
        )
        try:
            self.opts.end_run(
                self.ckpt_dir, self.opts.mlflow_uri, why, self.log, flag_of(self.cmd, "--experiment"), code
            )
        except Exception as e:  # the export that follows will fail and say so; never lose the alert
            self.log(f"the run could not be ended at its last checkpoint ({type(e).__name__}: {e})")

    def _rate(self) -> float | None:
        """The instance's hourly rate: the budget source's, else the ledger's last trusted rate."""
        if self.opts.budget_line is not None:
            snap = read_source(self.opts.budget_line.curr_cost_uri).snapshot
            if snap is not None and snap.rate_usd_per_hr > 0:
                return snap.rate_usd_per_hr
        return ledger.read_memory(self.ckpt_dir).rate_usd_per_hr or None

    def _alert_still_billing(self, code: int) -> None:
        rate = self._rate()
        bills = (
            f"${rate:.2f}/h (${rate * 24:.2f} a day)" if rate else "at its hourly rate (unknown here: no budget source)"
        )
        why = {
            CRASH_LOOP: "a crash loop (two starts ended at the same step with no new checkpoint)",
            GAVE_UP: f"--max-restarts {self.opts.max_restarts} reached",
            STOPPED: f"a stop by {signal.Signals(self.stop_signal).name if self.stop_signal else 'signal'}",
        }.get(self.ending or "", f"exit {code} ({describe_exit(code)})")
        latest = read_latest(self.ckpt_dir) or "none"
        after = (
            "Export the run (export_run), then terminate the instance."
            if code == EXIT_OK
            else "Fix the cause and resume (--resume-from-latest), or export the run and terminate the instance."
        )
        body = (
            f"The watchdog ended after {why}; nothing is training now. If this machine is still up it keeps "
            f"billing {bills} until you terminate it. Latest complete checkpoint: {latest} in {self.ckpt_dir}. " + after
        )
        self.log(body, event="still_billing", exit_code=code, rate_usd_per_hr=rate)
        if self.opts.alerter is not None:
            self.opts.alerter.send_within(f"x1: nothing running, the instance still bills (exit {code})", body)

    def _supervise(self) -> int:
        cmd, pending, exited_at, failures, previous = self.cmd, None, 0.0, 0, None
        while True:
            started_at = time.time()
            if self.stop_signal is not None or self.budget_kill is not None:  # came during the backoff
                self.log("stop requested during the backoff; not relaunching")
                return self._stopped_between_starts()
            child = self._launch(cmd, len(self.restarts))
            if pending is not None:
                pending.downtime_s = round(time.time() - exited_at, 3)
                pending.relaunch_latency_s = lat = self._latency(child, started_at, exited_at)
                self.log(
                    f"restart {pending.number}: trainer back"
                    + (f", first step began {lat:.1f} s after the exit" if lat is not None else ""),
                    event="relaunched",
                    **asdict(pending),
                )
                pending = None
            code = self._trainer_code(child.wait(), started_at)
            exited_at = time.time()
            recorded = self._recorded_since(started_at)
            self._no_rendezvous(code, recorded)
            final = self._final(code)
            if final is not None:
                return final
            now = self._exit_now(code, started_at, recorded)
            if previous is not None and not NOT_CRASHES & {code, previous.code} and now.same_place(previous):
                at = f"step {now.step}" if now.step is not None else "before its first logged step"
                ckpt = f"step_{now.checkpoint_step:07d}" if now.checkpoint_step is not None else "none"
                self.log(
                    f"trainer exited with {code} ({describe_exit(code)}) {at} again, with no new checkpoint since "
                    f"the last start (latest: {ckpt}): a crash loop; not relaunching (fix the cause, then resume "
                    "with --resume-from-latest)",
                    event="crash_loop",
                    exit_code=code,
                    step=now.step,
                )
                self.ending = CRASH_LOOP
                return code if code >= 0 else 128 - code
            previous = now
            failures = failures + 1 if code != EXIT_INTERRUPTED else 0
            pending = self._record_restart(code, now, failures)
            if code == EXIT_STORE_UNAVAILABLE:
                self._store_down(pending, first=len(self.restarts) < 2 or self.restarts[-2].exit_code != code)
            if self._disk_full_exit(code, recorded) and self._wait_for_space():
                previous = None  # the disk was freed meanwhile: the next start is not judged against this one
            self._backoff(pending.backoff_s)
            cmd = with_resume(self.cmd)

    def _store_down(self, pending: Restart, first: bool) -> None:
        """Exit 8: the trainer waited checkpoint.remote_wait_min for the store and it never answered. Relaunched
        (each start waits again, the budget line watching); the first of a series is alerted: the machine bills
        while nothing trains."""
        rate = self._rate()
        cost = f" (this machine bills ${rate:.2f}/h meanwhile)" if rate else ""
        body = (
            f"The trainer could not reach its checkpoint store (--ckpt-remote) at start and has no local "
            f"checkpoint (exit {EXIT_STORE_UNAVAILABLE}). The watchdog relaunches it in {pending.backoff_s:.0f} s "
            f"(restart {pending.number}/{self.opts.max_restarts}); each start waits for the store again{cost}. "
            "Check the store's endpoint, keys and status page; stop the watchdog (SIGTERM) to give up."
        )
        self.log(body, event="store_unavailable", restart=pending.number, first=first)
        if first and self.opts.alerter is not None:
            self.opts.alerter.send_within(
                f"x1: the checkpoint store cannot be reached (exit {EXIT_STORE_UNAVAILABLE}); relaunching", body
            )

    # -- a full checkpoint disk --
    def _disk_full_exit(self, code: int, recorded: dict[str, Any] | None) -> bool:
        """Exit 7 (a checkpoint could not be written), an exit whose recorded reason is a full disk, or one the
        trainer could not record at all (a full disk refuses the status file too; torchrun reports 1)."""
        if code == EXIT_CHECKPOINT_FAILED or recorded is None:
            return True
        return says_disk_full(str(recorded.get("reason", "")))

    def space_needed(self) -> int:
        """Bytes a relaunch needs free on the checkpoint dir's filesystem: twice the newest complete checkpoint's
        size (the next step dir, and the final files copied from it at the end) plus ``--disk-margin-mb``."""
        latest = read_latest(self.ckpt_dir)
        size = dir_bytes(self.ckpt_dir / latest) if latest else 0
        return 2 * size + int(self.opts.disk_margin_mb * 1e6)

    def _wait_for_space(self) -> bool:
        """While the checkpoint disk has less free than ``space_needed``: say so once (log, event, alert) and again
        in the log every ``DISK_REMINDER_S``, look again every ``--disk-poll-s``; the budget line keeps running, and
        a stop or a budget kill ends the wait. True when it waited (space came back, or the wait was stopped)."""
        need, since, said = self.space_needed(), time.monotonic(), None
        while self.stop_signal is None and self.budget_kill is None:
            free = free_bytes(self.ckpt_dir)
            if free is None or free >= need:
                if said is not None:
                    self.log(
                        f"disk on {self.ckpt_dir}: {free_mb(free)} MB free after {time.monotonic() - since:.0f} s "
                        f"of waiting (a checkpoint needs {need / 1e6:,.0f} MB): relaunching",
                        event="disk_space_back",
                        free_mb=None if free is None else round(free / 1e6, 1),
                        need_mb=round(need / 1e6, 1),
                    )
                return said is not None
            if said is None:
                self._say_disk_full(free, need)
                said = time.monotonic()
            elif time.monotonic() - said >= DISK_REMINDER_S:
                self.log(
                    f"still waiting for space on {self.ckpt_dir}: {free_mb(free)} MB free, a checkpoint needs "
                    f"{need / 1e6:,.0f} MB ({time.monotonic() - since:.0f} s so far)"
                )
                said = time.monotonic()
            self._backoff(self.opts.disk_poll_s)
        return said is not None

    def _say_disk_full(self, free: int, need: int) -> None:
        line = (
            f"disk full on {self.ckpt_dir}: {free_mb(free)} MB free, a checkpoint needs {need / 1e6:,.0f} MB; waiting"
        )
        self.log(
            f"{line} (free space is checked every {self.opts.disk_poll_s:g} s and the trainer relaunched when it "
            "is there: delete old step dirs or other files on that disk; SIGTERM stops the watchdog)",
            event="disk_full",
            free_mb=round(free / 1e6, 1),
            need_mb=round(need / 1e6, 1),
        )
        if self.opts.alerter is not None:
            rate = self._rate()
            bills = f" at ${rate:.2f}/h" if rate else ""
            self.opts.alerter.send_within(
                f"x1: {line}",
                f"{line}. Nothing trains meanwhile and the machine still "
                f"bills{bills}. Free space on that disk: the watchdog then relaunches the "
                "trainer from its last complete checkpoint.",
            )

    def _backoff(self, seconds: float) -> None:
        """Wait before a relaunch; a stop or a budget kill ends the wait early."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.stop_signal is None and self.budget_kill is None:
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))

    def _stopped_between_starts(self) -> int:
        """No trainer runs: a budget kill ends like one that ended a trainer (exit status, alert, 4), a signal as
        a stop (75)."""
        if self.budget_kill is not None:
            return self._final(EXIT_BUDGET_NOW) or EXIT_BUDGET_NOW
        self.ending = STOPPED
        return EXIT_INTERRUPTED

    def _final(self, code: int) -> int | None:
        """The exit code to leave with, or None to consider a relaunch."""
        if self.budget_kill is not None:
            reason = f"budget: {self.budget_kill.reason} (stopped by the watchdog)"
            with contextlib.suppress(OSError):
                write_exit_status(self.ckpt_dir, EXIT_BUDGET_NOW, reason)
            self.log(
                f"trainer ended (exit {code}) by the watchdog's budget stop; not relaunching",
                event="final_exit",
                exit_code=EXIT_BUDGET_NOW,
            )
            if self.opts.alerter is not None:
                from ..budget.monitor import stop_message  # torch-free: the watchdog never imports torch

                line = self.opts.budget_line
                subject, body = stop_message(
                    EXIT_BUDGET_NOW, reason, line.cap_usd if line else 0.0, self.budget_kill.spent_usd, None
                )
                self.opts.alerter.send_within(subject, body)
            return EXIT_BUDGET_NOW
        if self.stop_signal is not None:
            self.log(
                f"trainer exited with {code} ({describe_exit(code)}) after the forwarded signal; not relaunching",
                event="stopped",
                exit_code=code,
            )
            self.ending = STOPPED
            return code if code >= 0 else EXIT_INTERRUPTED
        if not should_relaunch(code):
            self.log(
                f"trainer exited with {code} ({describe_exit(code)}); not relaunching",
                event="final_exit",
                exit_code=code,
                restarts=len(self.restarts),
            )
            return code if code >= 0 else 128 - code
        if len(self.restarts) >= self.opts.max_restarts:
            self.log(
                f"trainer exited with {code} ({describe_exit(code)}); --max-restarts {self.opts.max_restarts} "
                "reached, giving up",
                event="gave_up",
                exit_code=code,
            )
            self.ending = GAVE_UP
            return code if code >= 0 else 128 - code
        return None

    def _exit_now(self, code: int, started_at: float, recorded: dict[str, Any] | None) -> ExitPoint:
        """Where the start that began at ``started_at`` ended: its own progress (a progress file written by an
        earlier start says nothing about this one) and the newest complete checkpoint."""
        progress = read_progress(self.ckpt_dir) or {}
        latest = read_latest(self.ckpt_dir)
        ckpt_step = int(latest.split("_")[1]) if latest and latest.startswith("step_") else None
        step = progress.get("step") if isinstance(progress.get("step"), int) else None
        mine = float(progress.get("started_unix") or progress.get("time_unix") or 0) >= started_at - 1
        elsewhere = not mine and recorded is not None and bool(recorded.get("rank"))
        return ExitPoint(code, step if mine else None, ckpt_step, elsewhere)

    def _record_restart(self, code: int, now: ExitPoint, failures: int) -> Restart:
        backoff = min(self.opts.backoff_s * (2 ** max(failures - 1, 0)), self.opts.max_backoff_s)
        # progress.json is written every log step, so the stop's own checkpoint can be newer than it
        lost = (
            max(now.step - now.checkpoint_step, 0)
            if now.step is not None and now.checkpoint_step is not None
            else now.step
        )
        pending = Restart(
            len(self.restarts) + 1, code, describe_exit(code), now.step, now.checkpoint_step, lost, backoff
        )
        self.restarts.append(pending)
        latest = f"step_{now.checkpoint_step:07d}" if now.checkpoint_step is not None else "none"
        self.log(
            f"trainer exited with {code} ({describe_exit(code)}) at step {now.step}; latest checkpoint {latest} "
            f"(about {lost if lost is not None else '?'} steps to redo); relaunching with --resume-from-latest "
            f"in {backoff:.1f} s (restart {pending.number}/{self.opts.max_restarts})"
        )
        return pending
