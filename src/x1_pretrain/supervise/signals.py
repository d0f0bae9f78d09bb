"""Signal handlers of the trainer: they only set flags that the loop reads between optimizer steps."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.contract import WATCHDOG_PID_ENV
from ..core.fileio import pid_alive


def install_signal_handlers(stop: Any) -> Callable[[], None]:
    """SIGTERM/SIGINT/SIGHUP (a closed terminal): finish the step, checkpoint, exit 75. A second SIGINT aborts
    at once. SIGUSR1: checkpoint after the current step and keep training. Returns a function that puts the
    previous handlers back."""
    names = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    previous = {s: signal.getsignal(s) for s in names}

    def on_stop(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and stop.requested is not None:
            raise KeyboardInterrupt
        if stop.requested is None:
            stop.requested = signal.Signals(signum).name
            stop.requested_at = time.monotonic()
            _acknowledge(stop.requested)

    def on_usr1(_signum: int, _frame: Any) -> None:
        stop.checkpoint_now = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_stop)
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, on_usr1)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def _acknowledge(name: str) -> None:
    """Say at once that the stop was heard (the step may run on for a while before the loop reports it). A raw
    write on the descriptor: a handler that wrote through sys.stdout could land inside the main thread's own
    write to it and fail as a reentrant call."""
    more = "; a second Ctrl-C aborts without a checkpoint (exit 130)" if name == "SIGINT" else ""
    with contextlib.suppress(OSError):  # a closed terminal (SIGHUP) or a gone reader
        os.write(1, f"[x1] {name} heard: finishing the current step, then a checkpoint{more}\n".encode())


def watch_parent(stop: Any, every_s: float = 2.0) -> threading.Event | None:
    """Under the watchdog: when the watchdog is gone (killed, its terminal closed), stop like SIGTERM, so no
    trainer runs on unsupervised. (The watchdog also asks the kernel for SIGTERM at its death; this covers
    the systems and cases where that does not arrive.) Returns an event that ends the watch, or None."""
    pid = os.environ.get(WATCHDOG_PID_ENV, "")
    if not pid.isdigit():
        return None
    if os.getppid() == int(pid) and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # the kernel's SIGTERM at the watchdog's death
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    done = threading.Event()

    def run() -> None:
        while not done.wait(every_s):
            if not pid_alive(int(pid)) and stop.requested is None:
                stop.requested = "the watchdog's end"
                stop.requested_at = time.monotonic()
                return

    threading.Thread(target=run, name="x1-parent-watch", daemon=True).start()
    return done


class StopDeadline:
    """A bound on the stop: from the stop request (SIGTERM, SIGHUP, the watchdog's end) to the process's exit in
    at most ``grace_s``. The loop writes the checkpoint first and MLflow gets what is left (``remaining``); if
    the deadline passes anyway (a step that does not end, a store that does not answer), ``on_expire`` runs on
    this thread: it records the exit status and ends the process."""

    def __init__(self, stop: Any, grace_s: float, on_expire: Callable[[], None], poll_s: float = 0.1) -> None:
        self.stop, self.grace_s, self.on_expire, self.poll_s = stop, grace_s, on_expire, poll_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="x1-stop-deadline", daemon=True)

    def start(self) -> StopDeadline:
        self._thread.start()
        return self

    def remaining(self) -> float | None:
        """Seconds left before the deadline, or None while no stop was requested."""
        if self.stop.requested_at is None:
            return None
        return self.grace_s - (time.monotonic() - self.stop.requested_at)

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            left = self.remaining()
            if left is not None and left <= 0:
                self.on_expire()
                return

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)  # no thread of ours may outlive the process group's teardown
