"""What a task evaluation costs, before it is measured: its size in training steps.

An evaluation runs the forward pass only, over each item's tokens once (contexts shared): a third of a
training token's FLOPs per token. It runs in smaller, padded batches than training and without compilation,
so it is assumed to reach ``EVAL_EFFICIENCY`` of the training speed (conservative). ``plan`` prices the
evaluations with this; in the loop the budget uses it until the first evaluation has been timed, then the
measured seconds.
"""

from __future__ import annotations

from .registry import TASKS, check_tasks

EVAL_EFFICIENCY = 0.5  # the evaluation's tokens/s over a third of training's: an assumption until measured


def eval_tokens(names: list[str], limit: int | None) -> float:
    """Input tokens of one evaluation of ``names`` on the first ``limit`` items of each (all when None)."""
    total = 0.0
    for name in check_tasks(names):
        s = TASKS[name]
        total += (s.items if limit is None else min(limit, s.items)) * s.tokens_per_item
    return total


def eval_in_steps(names: list[str], limit: int | None, tokens_per_step: int) -> float:
    """One evaluation's estimated wall time in training steps (multiply by the step time for seconds)."""
    if not names or tokens_per_step <= 0:
        return 0.0
    return eval_tokens(names, limit) / 3 / EVAL_EFFICIENCY / tokens_per_step
