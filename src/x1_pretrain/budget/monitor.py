"""The budget guard at run time: the periodic monitor the trainer consults after each step. The decision
itself is :func:`budget.guard.decide` (pure); what the loop does with it is the trainer's business."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .guard import Decision, Limits, Memory, Progress, Reading, decide, read_source


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Effects:
    """The monitor's side effects, injected so tests can fake time, the source and alerts."""

    read: Callable[[str], Reading] = read_source
    now: Callable[[], datetime] = _utc_now
    monotonic: Callable[[], float] = time.monotonic
    send_alert: Callable[[str, str], Any] | None = None
    log: Callable[[str], None] = print
    metrics: Callable[[int, dict[str, float]], None] | None = None


class BudgetMonitor:
    """Runs the guard during training (a loop StepHook): an immediate check at start, then one every
    ``check_every_s`` of wall-clock. Side effects come in as callables so tests can fake time and alerts."""

    def __init__(self, source: str, limits: Limits, check_every_s: float, effects: Effects | None = None) -> None:
        fx = effects or Effects()
        self.source = source
        self.limits = limits
        self.check_every_s = check_every_s
        self._read = fx.read
        self._now = fx.now
        self._mono = fx.monotonic
        self._send = fx.send_alert
        self._log = fx.log
        self._metrics = fx.metrics
        self.memory = Memory()
        self.last: Decision | None = None
        self._last_check: float | None = None
        self._seen = 0
        self._warm: tuple[int, float] | None = None  # (step, time) after the first steps (compile, warm-up)

    def snapshot_json(self) -> dict[str, Any] | None:
        """For trainer_state.json: the last good reading and the last decision."""
        if self.last is None:
            return None
        return {"last_good": self.memory.last_good.to_json() if self.memory.last_good else None,
                "action": self.last.action.value, "reason": self.last.reason, "spent_usd": self.last.spent_usd,
                "projected_usd": self.last.projected_usd, "cap_usd": self.limits.cap_usd}

    def check(self, steps_done: int, total_steps: int, final_checkpoint_s: float,
              steps_per_hour: float | None = None) -> Decision:
        now_m = self._mono()
        progress = Progress(steps_done, total_steps, steps_per_hour, final_checkpoint_s)
        decision, self.memory = decide(self._read(self.source), self.limits, self._now(), progress, self.memory)
        self.last = decision
        self._last_check = now_m
        for w in decision.warnings:
            self._log(f"budget warning: {w}")
        if self._metrics is not None:
            values = {k: v for k, v in (("budget/spent_usd", decision.spent_usd),
                                        ("budget/projected_usd", decision.projected_usd)) if v is not None}
            if values:
                self._metrics(steps_done, values)
        spent = f"${decision.spent_usd:.2f}" if decision.spent_usd is not None else "unknown"
        proj = f"${decision.projected_usd:.2f}" if decision.projected_usd is not None else "unknown"
        self._log(f"budget check: spent {spent}, projected {proj}, cap ${self.limits.cap_usd:.2f} -> "
                  f"{decision.action.value}")
        for message in decision.alerts:
            if self._send is not None:
                self._send(f"x1 budget: {message[:80]}", message)
        return decision

    def due(self) -> bool:
        return self._last_check is None or self._mono() - self._last_check >= self.check_every_s

    def steps_per_hour(self, step: int) -> float | None:
        """Measured wall-clock speed since the warm-up (evals and checkpoints included, compilation not)."""
        self._seen += 1
        now = self._mono()
        if self._warm is None:
            if self._seen >= 3:
                self._warm = (step, now)
            return None
        done, hours = step - self._warm[0], (now - self._warm[1]) / 3600
        return done / hours if done >= 2 and hours > 0 else None

    def after_step(self, steps_done: int, total_steps: int, final_checkpoint_s: float) -> Decision | None:
        """Called after each optimizer step: a decision when a check was due, else None."""
        sph = self.steps_per_hour(steps_done)
        if not self.due():
            return None
        return self.check(steps_done, total_steps, final_checkpoint_s, sph)
