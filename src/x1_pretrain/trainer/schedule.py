"""Pure functions of the step: the learning-rate schedule and where it ends.

* ``cosine``: linear warmup over ``warmup_steps`` (step 0 uses lr/warmup, step warmup-1 the full lr), then
  cosine decay from ``lr`` at step ``warmup_steps`` to ``min_lr`` at ``total_steps``; constant after.
* ``constant``: warmup, then ``lr``.
* ``wsd`` (warmup-stable-decay, Hägele et al. 2024): warmup, ``lr`` until the decay starts, then a decay of
  ``decay_shape`` (``linear``, ``1-sqrt``, ``cosine``) that reaches ``min_lr`` exactly at the last step of the
  run. The decay takes ``decay_fraction`` of the run.

A :class:`Horizon` says where the run ends and how its decay runs. Fixed for cosine and constant; with
``--budget-fit`` the budget guard moves it (:func:`retarget`): before the decay starts the end may move
later or earlier; once the decay has started it never restarts, and a shorter end compresses what is left
of it (the learning rate stays continuous and still reaches ``min_lr`` at the new last step).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..core.config import OptimConfig


@dataclass(frozen=True)
class Horizon:
    end_step: int  # optimizer steps in the run: the last one has index end_step - 1
    decay_start: int  # index of the first decaying step (wsd)
    anchor_step: int  # decay progress is counted from this step ...
    anchor_progress: float = 0.0  # ... with this share of the decay already done (a compressed decay)

    def progress(self, step: int) -> float:
        """Share of the decay done after step ``step`` (0-based): 1.0 at the last step of the run."""
        if step < self.decay_start:
            return 0.0
        span = max(self.end_step - self.anchor_step, 1)
        done = self.anchor_progress + (1.0 - self.anchor_progress) * (step - self.anchor_step + 1) / span
        return min(max(done, 0.0), 1.0)

    def decaying(self, next_step: int) -> bool:
        """Whether the decay has begun before step ``next_step`` runs."""
        return next_step > self.decay_start

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Horizon:
        return cls(int(d["end_step"]), int(d["decay_start"]), int(d["anchor_step"]), float(d["anchor_progress"]))


def _decay_start(end: int, not_before: int, optim: OptimConfig) -> int:
    decay_steps = max(1, math.ceil(optim.decay_fraction * end))
    return min(max(end - decay_steps, not_before, optim.warmup_steps), end - 1)


def planned(total_steps: int, optim: OptimConfig) -> Horizon:
    """The horizon of a run planned for ``total_steps`` from the start."""
    start = _decay_start(total_steps, 0, optim) if optim.schedule == "wsd" else total_steps
    return Horizon(total_steps, start, start, 0.0)


def retarget(h: Horizon, next_step: int, end: int, optim: OptimConfig) -> Horizon:
    """The horizon after moving the end to ``end`` (> ``next_step``) when step ``next_step`` is next."""
    if end <= next_step:
        raise ValueError(f"end {end} must be after the next step {next_step}")
    if not h.decaying(next_step):
        start = _decay_start(end, next_step, optim)
        return Horizon(end, start, start, 0.0)
    if end >= h.end_step:
        return h  # a decay that has begun is never stretched nor restarted
    return Horizon(end, h.decay_start, next_step, h.progress(next_step - 1))


FIT_SLACK_STEPS = 1


def fitted_end(next_step: int, steps_that_fit: int, upper_bound: int, slack: int = FIT_SLACK_STEPS) -> int | None:
    """The run's end when ``steps_that_fit`` more steps fit (never past ``upper_bound``), or None: nothing
    fits, not even one step of decay.

    The end is planned ``slack`` steps short of what the money pays for, while the stop still comes only when
    not one step fits: the spend's jitter (a reading that lands late, a slow step) then moves the end instead of
    cutting the run a step before its decay reaches min_lr. It costs ``slack`` steps of money (in the lab, a
    fraction of a cent)."""
    if steps_that_fit < 1:
        return None
    return min(upper_bound, next_step + max(steps_that_fit - slack, 1))


def _shape(progress: float, shape: str) -> float:
    if shape == "linear":
        return 1.0 - progress
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_at(step: int, optim: OptimConfig, horizon: Horizon | int) -> float:
    """Learning rate for optimizer step ``step`` (0-based); ``horizon`` is a Horizon or a planned total."""
    h = planned(horizon, optim) if isinstance(horizon, int) else horizon
    warm = optim.lr * (step + 1) / optim.warmup_steps if step < optim.warmup_steps else optim.lr
    if optim.schedule == "constant":
        return warm
    if optim.schedule == "wsd":
        if step < h.decay_start:
            return warm
        decayed = optim.min_lr + _shape(h.progress(step), optim.decay_shape) * (optim.lr - optim.min_lr)
        return min(warm, decayed)
    if step < optim.warmup_steps:
        return warm
    decay_steps = max(h.end_step - optim.warmup_steps, 1)
    progress = min((step - optim.warmup_steps) / decay_steps, 1.0)
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (optim.lr - optim.min_lr)
