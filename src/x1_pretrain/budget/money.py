"""The one piece of arithmetic every dollar figure comes from: what a run costs in all if it trains so many
more hours, and how many hours (steps) fit under the cap.

``plan`` (before renting), the launch gate (before the first step), the budget guard's projection (during
the run) and the runbook's numbers all use :class:`Money` and :func:`steps_that_fit` with the same
assumptions: the bill's fixed lines (disk, egress), the buffer kept for a restart, billed set-up hours
still to come, and a reserve for the final checkpoint, export and shutdown. Pure: the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass

from ..core.defaults import DEFAULT_MFU, DEFAULT_RESERVE_MIN  # noqa: F401  (shared with the config's budget:)


@dataclass(frozen=True, kw_only=True)
class Lines:
    """The bill's lines besides compute (USD): the lab's egress $1 and disk $2, and a $5 buffer for one restart."""

    egress_usd: float = 1.0
    disk_usd: float = 2.0
    buffer_usd: float = 5.0

    @property
    def fixed(self) -> float:
        return self.egress_usd + self.disk_usd


@dataclass(frozen=True, kw_only=True)
class EvalCost:
    """The in-loop task evaluation as the money counts it: one every ``every`` steps (0: none before the end)
    and one when the run ends. Its wall time is ``measured_s`` once one has run whole, else ``in_steps``
    training steps' worth (evals/cost.py), never more than ``cap_s`` (``train.eval_tasks_max_s`` cuts it
    there). ``spent_s``: seconds spent evaluating so far in this process (kept out of the measured step time)."""

    every: int = 0
    in_steps: float = 0.0
    measured_s: float | None = None
    cap_s: float = math.inf
    spent_s: float = 0.0

    @property
    def configured(self) -> bool:
        return self.in_steps > 0 or self.measured_s is not None

    def per_eval_s(self, step_s: float) -> float:
        """Seconds of one evaluation, given the training step time."""
        if not self.configured:
            return 0.0
        s = self.measured_s if self.measured_s is not None else self.in_steps * step_s
        return min(s, self.cap_s)

    def per_step_s(self, step_s: float) -> float:
        """The periodic evaluations' share of each step."""
        return self.per_eval_s(step_s) / self.every if self.every > 0 else 0.0

    def final_s(self, step_s: float) -> float:
        """What the reserve holds for the evaluation at the end: the measured time once one has run whole, else
        its time cap (an estimate from its size is not money one can count on), else the estimate."""
        if not self.configured:
            return 0.0
        if self.measured_s is None and math.isfinite(self.cap_s):
            return self.cap_s
        return self.per_eval_s(step_s)


@dataclass(frozen=True)
class Money:
    """Where the money stands: the cap, the rate, the lines, and what is already billed."""

    cap_usd: float
    rate_usd_per_hr: float
    _: KW_ONLY  # the rest by name: several floats in a row
    lines: Lines = Lines()
    spent_usd: float = 0.0  # already billed (the sidecar's spent_usd)
    fixed_in_spent: bool = False  # spent_usd already carries the fixed lines (budget.json has fixed_usd)
    setup_hours: float = 0.0  # billed hours before the first step that are still to come
    reserve_min: float = DEFAULT_RESERVE_MIN

    @property
    def fixed_to_add(self) -> float:
        return 0.0 if self.fixed_in_spent else self.lines.fixed

    def total_usd(self, training_hours: float, buffer: bool = True) -> float:
        """The whole bill if the run trains ``training_hours`` more (and keeps the buffer, when asked)."""
        hours = training_hours + self.setup_hours + self.reserve_min / 60
        return (
            self.spent_usd
            + self.fixed_to_add
            + self.rate_usd_per_hr * hours
            + (self.lines.buffer_usd if buffer else 0.0)
        )

    def training_hours_that_fit(self, buffer: bool = True) -> float:
        if self.rate_usd_per_hr <= 0:
            return math.inf
        money = self.cap_usd - self.total_usd(0.0, buffer)
        return max(money / self.rate_usd_per_hr, 0.0)


def steps_that_fit(
    money: Money, step_s: float, max_training_hours: float | None = None, buffer: bool = True, paid_s: float = 0.0
) -> int:
    """Optimizer steps of ``step_s`` seconds that fit in the money (and in ``max_training_hours``).

    ``paid_s``: how long the step in flight has run (at most ``step_s``). Those seconds are already in the
    spend, and they count toward that step: a check late in a step must not find one step fewer than a check
    at its start, or the end moves in by a step every step and the last check stops the run short."""
    hours = money.training_hours_that_fit(buffer)
    if max_training_hours is not None:
        hours = min(hours, max(max_training_hours, 0.0))
    if not math.isfinite(hours):
        raise ValueError("no limit: the rate is not positive and no time window is given")
    return math.floor((hours * 3600 + min(max(paid_s, 0.0), step_s)) / step_s + 1e-9)
