"""A billing simulation for the demo and the fit-to-budget benchmark: a sidecar whose bill is a function of
the steps trained (``per_step(step)`` dollars for each step), written to budget.json as the real sidecar
writes it. Its hourly rate is that per-step price at the speed it measures, so the trainer's fit, which
multiplies a rate by a measured step time, sees the same money per step on any machine."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ..training.checkpoint import read_progress


class StepBilling:
    def __init__(self, budget: Path, ckpt: Path, per_step: Callable[[int], float], spent: float = 0.0,
                 step: int = 0) -> None:
        self.budget, self.ckpt, self.per_step = budget, ckpt, per_step
        self.spent, self.step = spent, step
        self._mark = (time.monotonic(), step)
        self.step_s = 0.2                      # until measured
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="x1-demo-billing", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        rate = self.per_step(self.step) * 3600 / self.step_s
        tmp = self.budget.with_suffix(".tmp")
        tmp.write_text(json.dumps({
            "spent_usd": round(self.spent, 6), "rate_usd_per_hr": rate, "hours_elapsed": 0.0,
            "projected_total_usd": round(self.spent, 6), "fixed_usd": {"disk_usd": 0.0, "egress_usd": 0.0},
            "last_update_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "provider": "simulated (dollars per step)"}))
        tmp.replace(self.budget)

    def _run(self) -> None:
        while not self._stop.is_set():
            step = int((read_progress(self.ckpt) or {}).get("step") or 0)
            if step > self.step:
                self.spent += sum(self.per_step(s) for s in range(self.step, step))
                t0, s0 = self._mark
                if step - s0 >= 5:
                    now = time.monotonic()
                    self.step_s, self._mark = (now - t0) / (step - s0), (now, step)
                self.step = step
            self._write()
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
