"""The watchdog's progress file (a loop StepHook), and how a budget decision maps to the loop's outcome."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..budget.guard import Action, Decision
from ..core.errors import EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW
from .checkpoint import write_progress
from .loop import Outcome


class ProgressFile:
    """Keeps ``progress.json`` in the checkpoint dir current for the watchdog (a StepHook)."""

    def __init__(self, ckpt_dir: Path, started: float, checkpointer: Any) -> None:
        self.dir, self.started, self.ckpt = ckpt_dir, started, checkpointer
        self.first_step_started: float | None = None
        self.first_step_s: float | None = None

    def after_step(self, run: Any, state: Any, metrics: dict[str, float]) -> None:
        now = time.time()
        first = self.first_step_started is None
        if first:
            self.first_step_started = now - state.last_step_s
            self.first_step_s = state.last_step_s
        if first or state.step % run.cfg.train.log_every == 0:
            write_progress(self.dir, {
                "pid": os.getpid(), "step": state.step, "time_unix": now, "started_unix": self.started,
                "first_step_started_unix": self.first_step_started, "first_step_s": self.first_step_s,
                "last_checkpoint_step": self.ckpt.last_saved_step,
                "total_steps": run.cfg.train.total_steps,
            })
        return None


def outcome_of(decision: Decision, step: int) -> tuple[Outcome, bool] | None:
    """Map a budget decision to the loop's (Outcome, write a checkpoint first) or None to carry on."""
    if decision.action == Action.EXIT_NOW:
        return Outcome(EXIT_BUDGET_NOW, f"budget: {decision.reason}", step), False
    if decision.action == Action.CHECKPOINT_AND_EXIT:
        return Outcome(EXIT_BUDGET_CHECKPOINT, f"budget: {decision.reason}", step), True
    return None
