"""A billing simulation for the demo and the fit-to-budget benchmark, written to budget.json as the real sidecar writes
it. The price is set per step (``per_step(step)`` dollars a step at the current step) and billed by the clock, as a
cloud bills: the hourly rate is that price at the speed the simulation measures over the last few steps (re-measured
at every step, so a machine that slows down under load is not billed ten steps' price for one), so a step costs
about ``per_step`` on any machine, and time without steps (start-up, evals, checkpoints) costs what it costs in a
real run. ``free_start_up=True`` starts the clock only at the trainer's first step (tests use it so that a loaded
machine's slow imports do not change how many steps the money buys)."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ..core.contract import read_progress


class StepBilling:
    WINDOW = 5  # steps the speed is measured over

    def __init__(
        self,
        budget: Path,
        ckpt: Path,
        per_step: Callable[[int], float],
        spent: float = 0.0,
        step: int = 0,
        step_s: float = 0.2,
        free_start_up: bool = False,
    ) -> None:
        self.budget, self.ckpt, self.per_step = budget, ckpt, per_step
        self._billing = not free_start_up  # False until the first step lands
        self.spent, self.step = spent, step
        self._marks: deque[tuple[float, int]] = deque(maxlen=self.WINDOW + 1)  # (time, step) of recent steps
        self.step_s = step_s  # the speed assumed until it is measured
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="x1-demo-billing", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        rate = self.per_step(self.step) * 3600 / self.step_s
        tmp = self.budget.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "spent_usd": round(self.spent, 6),
                    "rate_usd_per_hr": rate,
                    "hours_elapsed": 0.0,
                    "projected_total_usd": round(self.spent, 6),
                    "fixed_usd": {"disk_usd": 0.0, "egress_usd": 0.0},
                    # milliseconds: at a simulated $2 a second, a reading aged by whole seconds would be dollars off
                    "last_update_utc": datetime.now(timezone.utc)
                    .isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z"),
                    "provider": "simulated (dollars per step)",
                }
            )
        )
        tmp.replace(self.budget)

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self._billing:
                self.spent += self.per_step(self.step) / self.step_s * (now - last)
            last = now
            step = int((read_progress(self.ckpt) or {}).get("step") or 0)
            if step > self.step:
                self._billing = True
                self._marks.append((now, step))
                t0, s0 = self._marks[0]
                if step > s0:
                    self.step_s = (now - t0) / (step - s0)
                self.step = step
            self._write()
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
