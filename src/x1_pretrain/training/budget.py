"""The budget guard inside the trainer (rank 0): the monitor and its cost ledger, the watcher thread that
checks on its own clock, and what each verdict does.

* spent above the cap → this process exits 4 within seconds, from the watcher thread, whatever the training
  thread is doing (mid-step, compiling, stuck in a collective): alert, exit status, ``os._exit``;
* projected above the cap → the loop is asked to stop at the next step boundary with a checkpoint (exit 3);
  when no boundary comes within ``stop_wait_s``, the process exits 4 without a checkpoint and says so;
* every budget stop alerts through every configured channel with the spend, the cap, the reason, the
  checkpoint written and what to do next.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget.guard import Action, Decision, Limits
from ..budget.ledger import Ledger
from ..budget.monitor import BudgetMonitor, Effects
from ..budget.watcher import BudgetWatcher
from ..core import redact
from ..core.errors import EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW
from . import checkpoint as ck
from .loop import Outcome
from .options import BudgetOptions

Log = Callable[[str], None]
ALERT_DEADLINE_S = 15.0


@dataclass
class BudgetSetup:
    """The budget guard of this run (rank 0): its options, limits and alert channels."""

    opts: BudgetOptions
    limits: Limits
    alerter: Any

    def tags(self) -> dict[str, Any]:
        tags: dict[str, Any] = {"budget_cap_usd": self.limits.cap_usd, "budget_alert_usd": self.limits.alert_usd,
                                "budget_source": redact.url(self.opts.source)}
        if self.opts.force_launch:
            tags["force_launch"] = "true"
        return tags


def stop_message(code: int, reason: str, cap_usd: float, spent: float | None,
                 checkpoint: str | None) -> tuple[str, str]:
    """(subject, body) of a budget-stop alert: what happened and what to do next."""
    spent_s = f"${spent:.2f}" if spent is not None else "unknown"
    subject = f"x1 budget stop (exit {code}): spent {spent_s} of ${cap_usd:.2f}"
    if checkpoint:
        after = (f"The run ended at its checkpoint {checkpoint}; final.safetensors was written beside it.\n"
                 "Next: export the run (python -m x1_pretrain.export_run --mlflow-uri ... --output ...), check the "
                 "Definition of Done, then TERMINATE the instance: it keeps billing until you do.")
    else:
        after = ("No checkpoint was written for the steps since the last one (the money is already over, or the "
                 "loop could not reach a step boundary).\nNext: TERMINATE the instance now; the newest complete "
                 "checkpoint is still on disk for export_run or a resume under a higher cap.")
    return subject, f"Reason: {reason}\nSpent: {spent_s}; cap: ${cap_usd:.2f}.\n{after}"


class BudgetControl:
    """The guard of one trainer process; ``hook`` is what the loop sees after each step."""

    def __init__(self, setup: BudgetSetup, ckpt_dir: Path, log: Log, metrics: Any,
                 fallback: dict[str, Any] | None = None) -> None:
        self.setup, self.ckpt_dir, self.log = setup, ckpt_dir, log
        self.ledger = Ledger(ckpt_dir, setup.limits.cap_usd, log)
        effects = Effects(send_alert=self._send, log=log, metrics=metrics)
        self.monitor = BudgetMonitor(str(setup.opts.source), setup.limits, effects, self.ledger, fallback)
        self.watcher = BudgetWatcher(self.monitor.check, self.on_verdict, setup.opts.check_every_min * 60, log)
        self.request: tuple[int, str] | None = None
        self._timer: threading.Timer | None = None
        self._exit = os._exit  # replaced in tests that must not end the test process

    def _send(self, subject: str, body: str) -> Any:
        return self.setup.alerter.send_within(subject, body, ALERT_DEADLINE_S)

    # -- verdicts (called on the watcher thread) --
    def on_verdict(self, decision: Decision) -> None:
        if decision.action == Action.EXIT_NOW:
            self.exit_now(EXIT_BUDGET_NOW, f"budget: {decision.reason}", decision.spent_usd)
        elif decision.action == Action.CHECKPOINT_AND_EXIT and self.request is None:
            self.request = (EXIT_BUDGET_CHECKPOINT, f"budget: {decision.reason}")
            wait = self.setup.opts.stop_wait_s
            self.log(f"{decision.reason}: stopping at the next step boundary with a checkpoint (exit 3 if one "
                     f"comes within {wait:g} s)")
            self._timer = threading.Timer(wait, self._no_boundary, args=(decision, wait))
            self._timer.daemon = True
            self._timer.start()

    def _no_boundary(self, decision: Decision, wait: float) -> None:
        self.exit_now(EXIT_BUDGET_NOW, f"budget: {decision.reason}; no step boundary came within {wait:g} s (a hung "
                      "step, compile or collective?), so no checkpoint was written", decision.spent_usd)

    def exit_now(self, code: int, reason: str, spent: float | None) -> None:
        """End the process at once: no checkpoint, no MLflow flush; the alert and exit status first."""
        print(f"[x1] {reason}: exiting {code} now", flush=True)
        self.alert_stop(code, reason, spent, None)
        try:
            ck.write_exit_status(self.ckpt_dir, code, reason)
        except OSError as e:
            print(f"warning: could not record the exit status ({e})", file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(code)

    def alert_stop(self, code: int, reason: str, spent: float | None, checkpoint: str | None) -> None:
        subject, body = stop_message(code, reason, self.setup.limits.cap_usd, spent, checkpoint)
        self.ledger.event(self.monitor._fx.now(), "budget_stop", exit_code=code, reason=reason, checkpoint=checkpoint)
        self.ledger.save(self.monitor._fx.now(), self.monitor.memory)
        self._send(subject, body)

    # -- the loop's side --
    def after_step(self, run: Any, state: Any, metrics: dict[str, float]) -> tuple[Outcome, bool] | None:
        ckpt_s = getattr(run.checkpointer, "last_save_s", 0.0) or 0.0
        self.monitor.note_step(state.step, run.cfg.train.total_steps, ckpt_s)
        if self.request is None:
            return None
        if self._timer is not None:
            self._timer.cancel()  # the boundary came: the checkpoint will be written
        code, reason = self.request
        return Outcome(code, reason, state.step), True

    def close(self) -> None:
        self.watcher.stop()
        if self._timer is not None:
            self._timer.cancel()
