"""Signal handlers of the trainer: they only set flags that the loop reads between optimizer steps."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any


def install_signal_handlers(stop: Any) -> Callable[[], None]:
    """SIGTERM/SIGINT: finish the step, checkpoint, exit 75. A second SIGINT aborts at once.
    SIGUSR1: checkpoint after the current step and keep training. Returns a function that puts the
    previous handlers back."""
    names = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
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
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, on_usr1)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore
