"""The budget guard at run time: the monitor that checks (on its watcher thread, and before the first
step), keeps the cost ledger, logs, alerts and records metrics. The decision itself is
:func:`budget.guard.decide` (pure); what the trainer does with it is the trainer's business."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..core import names as N
from .guard import Decision, Limits, Memory, Progress, Reading, decide
from .ledger import Ledger, memory_to_json
from .money import EvalCost
from .source import read_source


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
    """Runs the guard during training: a check at start, then one whenever its watcher thread (or the loop)
    asks. The loop tells it the progress after each step (:meth:`note_step`); the memory is kept in the cost
    ledger when one is given, so it survives restarts. Side effects come in as callables (tests fake them)."""

    def __init__(
        self,
        source: str,
        limits: Limits,
        effects: Effects | None = None,
        ledger: Ledger | None = None,
        fallback: dict[str, Any] | None = None,
        fit_mode: bool = False,
    ) -> None:
        fx = effects or Effects()
        self.source = source
        self.limits = limits
        self._fx = fx
        self.fit_mode = fit_mode  # --budget-fit: a projection over the cap moves the end, not a stop
        self.ledger = ledger
        self.memory = ledger.load(fallback) if ledger is not None else Memory()
        self.last: Decision | None = None
        self._lock = threading.Lock()
        self._seen = 0
        self._warm: tuple[int, float, float] | None = None  # (step, time, eval seconds) after the warm-up steps
        self.steps_done, self.total_steps, self.checkpoint_s = 0, 0, 0.0
        self.evals = EvalCost()
        self.steps_per_hour: float | None = None  # training with its share of the periodic task evaluations
        self.train_step_s: float | None = None  # a step's wall time without the task evaluations
        self._last_step_at: float | None = None  # monotonic time the last step ended
        if ledger is not None:
            ledger.event(fx.now(), "process_start", pid=os.getpid())

    def snapshot_json(self) -> dict[str, Any] | None:
        """For trainer_state.json: the guard's memory and its last decision (read back on resume)."""
        if self.last is None:
            return None
        return {
            "last_good": self.memory.last_good.to_json() if self.memory.last_good else None,
            "memory": memory_to_json(self.memory),
            "action": self.last.action.value,
            "reason": self.last.reason,
            "spent_usd": self.last.spent_usd,
            "projected_usd": self.last.projected_usd,
            "cap_usd": self.limits.cap_usd,
        }

    def note_step(self, steps_done: int, total_steps: int, checkpoint_s: float, evals: EvalCost | None = None) -> None:
        """The loop's progress after a step, and the measured wall-clock speed since the warm-up (val evals and
        checkpoints included, compilation not). The task evaluations' seconds (``evals.spent_s``) are taken
        out of the measurement and counted at their own cost instead: one every ``evals.every`` steps, priced
        as measured (or estimated before the first), so a speed measured between two evaluations or across
        one says the same."""
        self._seen += 1
        now = self._fx.monotonic()
        self.steps_done, self.total_steps, self.checkpoint_s = steps_done, total_steps, checkpoint_s
        self.evals = evals or EvalCost()
        self._last_step_at = now
        if self._warm is None:
            if self._seen >= 3:
                self._warm = (steps_done, now, self.evals.spent_s)
            return
        done = steps_done - self._warm[0]
        seconds = now - self._warm[1] - (self.evals.spent_s - self._warm[2])
        if done >= 2 and seconds > 0:
            self.train_step_s = seconds / done
            self.steps_per_hour = 3600 / (self.train_step_s + self.evals.per_step_s(self.train_step_s))

    def progress(self) -> Progress:
        """What a check weighs: the steps done and to go, the speed, and the reserve's measured parts."""
        final_eval = self.evals.final_s(self.train_step_s or 0.0)
        return Progress(self.steps_done, self.total_steps, self.steps_per_hour, self.checkpoint_s, final_eval)

    def in_flight_s(self) -> float:
        """How long the step after ``steps_done`` has been running (0 before the first step ends)."""
        return 0.0 if self._last_step_at is None else self._fx.monotonic() - self._last_step_at

    def check(self) -> Decision:
        """One check now (thread-safe: the watcher thread and the loop may both call it)."""
        with self._lock:
            progress = self.progress()
            now = self._fx.now()
            decision, self.memory = decide(self._fx.read(self.source), self.limits, now, progress, self.memory)
            self.last = decision
            if self.ledger is not None:
                self.ledger.record(now, decision, self.memory, self.steps_done)
        self._report(decision)
        return decision

    def _report(self, decision: Decision) -> None:
        for w in decision.warnings:
            self._fx.log(f"budget warning: {w}")
        if self._fx.metrics is not None:
            values = {
                k: v
                for k, v in ((N.BUDGET_SPENT_USD, decision.spent_usd), (N.BUDGET_PROJECTED_USD, decision.projected_usd))
                if v is not None
            }
            if values:
                self._fx.metrics(self.steps_done, values)
        spent = f"${decision.spent_usd:.2f}" if decision.spent_usd is not None else "unknown"
        proj = f"${decision.projected_usd:.2f}" if decision.projected_usd is not None else "unknown"
        action = (
            "fit the end to the money" if self.fit_mode and decision.cause == "projection" else decision.action.value
        )
        self._fx.log(f"budget check: spent {spent}, projected {proj}, cap ${self.limits.cap_usd:.2f} -> {action}")
        for message in decision.alerts:
            if self._fx.send_alert is not None:
                self._fx.send_alert(f"x1 budget: {message[:80]}", message)


def stop_message(
    code: int, reason: str, cap_usd: float, spent: float | None, checkpoint: str | None
) -> tuple[str, str]:
    """(subject, body) of a budget-stop alert: what happened and what to do next."""
    spent_s = f"${spent:.2f}" if spent is not None else "unknown"
    subject = f"x1 budget stop (exit {code}): spent {spent_s} of ${cap_usd:.2f}"
    if checkpoint:
        after = (
            f"The run ended at its checkpoint {checkpoint}; final.safetensors was written beside it.\n"
            "Next: export the run (python -m x1_pretrain.export_run --mlflow-uri ... --output ...), check the "
            "Definition of Done, then TERMINATE the instance: it keeps billing until you do."
        )
    else:
        after = (
            "No checkpoint was written for the steps since the last one (the money is already over, or the "
            "loop could not reach a step boundary).\nNext: TERMINATE the instance now; the newest complete "
            "checkpoint is still on disk for export_run or a resume under a higher cap."
        )
    return subject, f"Reason: {reason}\nSpent: {spent_s}; cap: ${cap_usd:.2f}.\n{after}"
