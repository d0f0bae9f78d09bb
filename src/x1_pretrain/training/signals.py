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


WATCHDOG_PID_ENV = "X1_WATCHDOG_PID"   # set by the watchdog for the trainer it starts


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

    def alive() -> bool:
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def run() -> None:
        while not done.wait(every_s):
            if not alive() and stop.requested is None:
                stop.requested = "the watchdog's end"
                stop.requested_at = time.monotonic()
                return

    threading.Thread(target=run, name="x1-parent-watch", daemon=True).start()
    return done
