"""The budget guard on its own clock: a thread that checks every ``check_every_s`` of wall time, whatever
the training thread is doing (compiling, evaluating, checkpointing, waiting on data or on a hung NCCL call).

It calls ``on_verdict`` with each decision; the trainer decides what that means (exit at once, stop at the
next step boundary, re-fit the schedule). The thread never raises into the process: a failing check is
logged and retried at the next tick.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .guard import Decision


class BudgetWatcher:
    def __init__(
        self,
        check: Callable[[], Decision],
        on_verdict: Callable[[Decision], None],
        every_s: float,
        log: Callable[[str], None] = print,
    ) -> None:
        self._check, self._on_verdict, self.every_s, self._log = check, on_verdict, every_s, log
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.checks = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="x1-budget-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.every_s)
            if self._stop.is_set():
                return
            self._wake.clear()
            self.tick()

    def wake(self) -> None:
        """Check now, on the watcher's thread (the next regular check comes ``every_s`` after this one)."""
        self._wake.set()

    def tick(self) -> Any:
        """One check now (also what the thread does every ``every_s``)."""
        try:
            decision = self._check()
            self.checks += 1
            self._on_verdict(decision)
            return decision
        except Exception as e:  # the guard must outlive its own bugs
            self._log(f"budget warning: the check failed ({type(e).__name__}: {e}); retrying in {self.every_s:g} s")
            return None

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
