"""Pure functions of the step: the learning rate schedule."""

from __future__ import annotations

import math

from ..core.config import OptimConfig


def lr_at(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based).

    Linear warmup over ``warmup_steps`` (step 0 uses lr/warmup, step warmup-1 the full lr), then
    cosine decay from ``lr`` at step ``warmup_steps`` to ``min_lr`` at ``total_steps``; constant after.
    """
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return optim.lr
    decay_steps = max(total_steps - optim.warmup_steps, 1)
    progress = min((step - optim.warmup_steps) / decay_steps, 1.0)
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (optim.lr - optim.min_lr)
