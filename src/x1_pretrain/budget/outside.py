"""The second line of the budget guard, outside the trainer: the watchdog reads the same budget source and
the trainer's cost ledger itself, every ``poll_s``, and when the spend is above the cap it calls ``on_over``
(the watchdog ends the trainer's process group and never relaunches). So even a SIGSTOPped or wedged
trainer, whose own watcher thread cannot run, spends at most one poll (plus the kill grace) past the cap.

The rule is the guard's own (``decide``): the ledger's spend aged at its rate, or the aged reading,
whichever is higher. The watchdog never writes the ledger (the trainer is its only writer).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from .guard import Action, Decision, Limits, Progress, decide
from .ledger import read_memory
from .source import read_source


def check_from_outside(source: str, cap_usd: float, ckpt_dir: Path, now: datetime | None = None) -> Decision:
    """What the guard would decide now, from the source and the ledger alone."""
    now = now or datetime.now(timezone.utc)
    memory = read_memory(ckpt_dir)
    limits = Limits(cap_usd, cap_usd, unknown_grace_min=float("inf"))
    decision, _ = decide(read_source(source), limits, now, Progress(0, 0, None), memory)
    return decision


class OutsideGuard:
    def __init__(
        self, source: str, cap_usd: float, ckpt_dir: Path, poll_s: float, on_over: Callable[[Decision], None]
    ) -> None:
        self.source, self.cap_usd, self.ckpt_dir = source, cap_usd, ckpt_dir
        self.poll_s, self._on_over = poll_s, on_over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: Decision | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="x1-watchdog-budget", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                decision = check_from_outside(self.source, self.cap_usd, self.ckpt_dir)
            except Exception:  # a broken file or a bug must not end the watchdog
                continue
            if decision.action == Action.EXIT_NOW:
                self.fired = decision
                self._on_over(decision)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
