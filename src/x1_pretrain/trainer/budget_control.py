"""The budget guard inside the trainer (rank 0): the monitor and its cost ledger, the watcher thread that
checks on its own clock, and what each verdict does.

* spent above the cap → this process exits 4 within seconds, from the watcher thread, whatever the training
  thread is doing (mid-step, compiling, stuck in a collective): alert, exit status, ``os._exit``;
* projected above the cap → the loop is asked to stop at the next step boundary with a checkpoint (exit 3);
  when no boundary comes within ``stop_wait_s``, the process exits 4 without a checkpoint and says so;
* every budget stop alerts through every configured channel with the spend, the cap, the reason, the
  checkpoint written and what to do next;
* with ``budget.fit`` (``--budget-fit``) a projection over the cap is not a stop: each check computes how many
  more steps the money left (and ``budget.max_hours``) pays for at the measured step time and moves the
  schedule's end there (the loop applies it at the next step boundary, on every rank); only when not even one
  step fits does the run stop with a checkpoint (exit 3).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..budget.guard import Action, Decision, Limits, money_now
from ..budget.ledger import Ledger
from ..budget.money import EvalCost, steps_that_fit
from ..budget.monitor import BudgetMonitor, Effects, stop_message
from ..budget.watcher import BudgetWatcher
from ..core import contract, redact
from ..core import names as N
from ..core.config import BudgetConfig, OptimConfig
from ..core.contract import EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW
from ..core.log import Log
from .loop import Callback, Outcome, Verdict
from .schedule import Horizon, fitted_end, planned, retarget

_log = logging.getLogger(__name__)

ALERT_DEADLINE_S = 15.0


@dataclass
class BudgetSetup:
    """The budget guard of this run (rank 0): the config's budget section, where the spend is read, the limits
    and the alert channels."""

    cfg: BudgetConfig
    curr_cost_uri: str
    limits: Limits
    alerter: Any
    force_launch: bool = False

    def tags(self) -> dict[str, Any]:
        tags: dict[str, Any] = {
            N.TAG_BUDGET_CAP_USD: self.limits.cap_usd,
            N.TAG_BUDGET_ALERT_USD: self.limits.alert_usd,
            N.TAG_BUDGET_CURR_COST_URI: redact.url(self.curr_cost_uri),
        }
        if self.force_launch:
            tags[N.TAG_FORCE_LAUNCH] = "true"
        return tags


@dataclass(frozen=True, kw_only=True)
class FitContext:
    """What ``budget.fit`` (``--budget-fit``) needs besides the money: the bound, the schedule and the clock."""

    total_steps: int  # the upper bound (--total-steps)
    optim: OptimConfig
    expected_step_s: float | None  # until the speed is measured (--budget-expected-step-s, or the GPU peak)
    max_hours: float | None = None  # the run's wall-clock window, from its first start (downtime included)
    first_start_estimate_unix: float = field(default_factory=time.time)  # used when the ledger has no record


class BudgetControl(Callback):
    """The guard of one trainer process; ``after_step`` is what the loop sees after each step."""

    def __init__(
        self,
        setup: BudgetSetup,
        ckpt_dir: Path,
        log: Log,
        metrics: Any,
        fallback: dict[str, Any] | None = None,
        fit: FitContext | None = None,
        evals: Callable[[], EvalCost] | None = None,
    ) -> None:
        self.setup, self.ckpt_dir, self.log = setup, ckpt_dir, log
        self.evals = evals  # the task evaluation's cost so far (trainer/task_eval.py), when one is configured
        self.fit, self.metrics = fit, metrics
        self.horizon: Horizon | None = None  # the loop's, as of the last step
        self.proposed_end: int = 0
        self._fitted: int | None = None  # the end last proposed (to log changes only)
        self.ledger = Ledger(ckpt_dir, setup.limits.cap_usd, log)
        effects = Effects(send_alert=self._send, log=log, metrics=metrics)
        self.monitor = BudgetMonitor(
            setup.curr_cost_uri, setup.limits, effects, self.ledger, fallback, fit_mode=fit is not None
        )
        self.watcher = BudgetWatcher(self.monitor.check, self.on_verdict, setup.cfg.check_every_min * 60, log)
        # budget.max_hours counts from the run's first start, kept in the ledger across restarts and machines
        self.run_started_unix = self.ledger.run_started(fit.first_start_estimate_unix) if fit else time.time()
        self.request: tuple[int, str] | None = None
        self._replanned = False  # the check at this process's first measured speed (another GPU, another price)
        self._timer: threading.Timer | None = None
        self._exit = os._exit  # replaced in tests that must not end the test process

    def _send(self, subject: str, body: str) -> Any:
        return self.setup.alerter.send_within(subject, body, ALERT_DEADLINE_S)

    # -- verdicts (called on the watcher thread) --
    def first_check(self) -> tuple[int, str, float | None]:
        """The check before the first step: (exit code or 0, reason, spend)."""
        d = self.monitor.check()
        if d.action == Action.EXIT_NOW:
            return EXIT_BUDGET_NOW, f"budget: {d.reason}", d.spent_usd
        if self.fit is not None and d.cause != "unknown":
            self._refit(d)
            return (*self.request, d.spent_usd) if self.request else (0, "", d.spent_usd)
        if d.action == Action.CHECKPOINT_AND_EXIT:
            return EXIT_BUDGET_CHECKPOINT, f"budget: {d.reason}", d.spent_usd
        return 0, "", d.spent_usd

    def on_verdict(self, decision: Decision) -> None:
        if decision.action == Action.EXIT_NOW:
            self.exit_now(EXIT_BUDGET_NOW, f"budget: {decision.reason}", decision.spent_usd)
        elif self.fit is not None and decision.cause != "unknown":
            self._refit(decision)
        elif decision.action == Action.CHECKPOINT_AND_EXIT and self.request is None:
            self._ask_to_stop(decision.reason)

    def _ask_to_stop(self, reason: str) -> None:
        if self.request is not None:
            return
        self.request = (EXIT_BUDGET_CHECKPOINT, f"budget: {reason}")
        wait = self.setup.cfg.stop_wait_s
        self.log(
            f"warning: {reason}: stopping at the next step boundary with a checkpoint (exit 3 if one comes within "
            f"{wait:g} s)"
        )
        self._timer = threading.Timer(wait, self._no_boundary, args=(reason, wait))
        self._timer.daemon = True
        self._timer.start()

    def _no_boundary(self, reason: str, wait: float) -> None:
        last = self.monitor.last
        self.exit_now(
            EXIT_BUDGET_NOW,
            f"budget: {reason}; no step boundary came within {wait:g} s (a hung step, "
            "compile or collective?), so no checkpoint was written",
            last.spent_usd if last else None,
        )

    def _refit(self, decision: Decision) -> None:
        """budget.fit: move the end to what the money and the time still pay for."""
        fit, m = self.fit, self.monitor
        assert fit is not None
        progress = m.progress()
        if m.steps_per_hour:
            step_s = 3600 / m.steps_per_hour  # the task evaluations' share included
        elif fit.expected_step_s is not None:  # not measured yet: the expected step, the evaluations estimated
            step_s = fit.expected_step_s + m.evals.per_step_s(fit.expected_step_s)
            progress = replace(progress, final_eval_s=m.evals.final_s(fit.expected_step_s))
        else:
            step_s = None
        if step_s is None or decision.spent_usd is None:
            return  # nothing to fit with yet: the planned end stands until the speed is measured
        money = money_now(self.setup.limits, m.memory, decision.spent_usd, progress)
        hours_left = None
        if fit.max_hours is not None:
            used_h = (time.time() - self.run_started_unix) / 3600
            hours_left = fit.max_hours - used_h - money.reserve_min / 60
        n = steps_that_fit(money, step_s, hours_left, buffer=False, paid_s=m.in_flight_s())
        end = fitted_end(m.steps_done, n, fit.total_steps)
        if end is None:
            left = max(self.setup.limits.cap_usd - decision.spent_usd, 0.0)
            self._ask_to_stop(
                f"not even one more step fits (${left:.2f} left at ${money.rate_usd_per_hr:.2f}/h, "
                f"{step_s:.2f} s a step, reserve {money.reserve_min:g} min)"
            )
            return
        base = self.horizon or planned(fit.total_steps, fit.optim)
        preview = retarget(base, m.steps_done, end, fit.optim) if end != base.end_step else base
        if preview.end_step != self._fitted:
            was = self._fitted or base.end_step
            self.log(
                f"budget fit: the run ends at step {preview.end_step} (was {was}), the decay "
                f"{'continues' if base.decaying(m.steps_done) else 'starts at step ' + str(preview.decay_start)}"
                f"; spent ${decision.spent_usd:.2f} of ${self.setup.limits.cap_usd:.2f} at "
                f"${money.rate_usd_per_hr:.2f}/h, {step_s:.2f} s a step"
            )
        if self.metrics is not None:
            self.metrics(
                m.steps_done,
                {
                    N.BUDGET_PLANNED_END_STEP: float(preview.end_step),
                    N.BUDGET_DECAY_START_STEP: float(preview.decay_start),
                },
            )
        self.proposed_end = self._fitted = preview.end_step

    def exit_now(self, code: int, reason: str, spent: float | None) -> None:
        """End the process at once: no checkpoint, no MLflow flush; the alert and exit status first."""
        _log.warning(f"{reason}: exiting {code} now")
        self.alert_stop(code, reason, spent, None)
        contract.record_exit_status(self.ckpt_dir, code, reason)
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(code)

    def alert_stop(self, code: int, reason: str, spent: float | None, checkpoint: str | None) -> None:
        subject, body = stop_message(code, reason, self.setup.limits.cap_usd, spent, checkpoint)
        self.ledger.event(self.monitor._fx.now(), "budget_stop", exit_code=code, reason=reason, checkpoint=checkpoint)
        self.ledger.save(self.monitor._fx.now(), self.monitor.memory)
        self._send(subject, body)

    # -- the loop's side --
    def after_step(self, run: Any, state: Any, report: Any) -> Verdict | None:
        ckpt_s = getattr(run.checkpointer, "last_save_s", 0.0) or 0.0
        self.horizon = run.horizon
        self.monitor.note_step(state.step, run.end_step, ckpt_s, self.evals() if self.evals else None)
        if not self._replanned and self.monitor.train_step_s is not None:
            self._replanned = True  # this machine's speed, and the price the next check reads: plan with them now
            self.log(
                f"budget: {self.monitor.train_step_s:.2f} s a step measured after the warm-up on this machine: "
                f"checking the plan with it and the current rate now, not in "
                f"{self.setup.cfg.check_every_min:g} min"
            )
            self.watcher.wake()
        if self.proposed_end:
            run.proposed_end, self.proposed_end = self.proposed_end, 0
        if self.request is None:
            return None
        if self._timer is not None:
            self._timer.cancel()  # the boundary came: the checkpoint will be written
        code, reason = self.request
        if state.step >= run.end_step:  # the stop came with the last step: nothing is cut, the run finishes
            self.log(f"{reason}: the run is at its last step ({state.step}) already, so it finishes normally")
            self.request = None
            return None
        return Outcome(code, reason, state.step), True

    def close(self) -> None:
        self.watcher.stop()
        if self._timer is not None:
            self._timer.cancel()
