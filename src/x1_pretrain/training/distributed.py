"""Data parallelism with PyTorch's own stack: torchrun sets the environment, DDP syncs gradients.

Rank 0 alone logs to MLflow, writes checkpoints and talks to the budget guard; whatever it decides, and
any rank's signal, is agreed on by every rank after each step (one tiny all-reduce), so all ranks stop
together at the same step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def chunks(self, chunks_per_step: int) -> list[int]:
        """The chunk indices (micro-batches) this rank runs each step: micro-step m of rank r takes chunk
        m*size + r, so the union over ranks is the single-process step's chunks 0..chunks_per_step-1 whatever the
        rank count (``chunks_per_step`` is ``train.grad_accum_steps``, a multiple of the rank count)."""
        return [m * self.size + self.rank for m in range(chunks_per_step // self.size)]


def world_from_env() -> World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    return World(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"])), size)


def init(world: World, device_type: str) -> None:
    if world.size > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)


def shutdown(world: World) -> None:
    if world.size > 1 and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def agree_max(values: list[int], world: World, device: Any) -> list[int]:
    """Element-wise max over ranks (identity on one process)."""
    if world.size <= 1:
        return values
    t = torch.tensor(values, dtype=torch.int64, device=device)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return [int(v) for v in t.tolist()]


def mean_over_ranks(value: torch.Tensor, world: World) -> torch.Tensor:
    """Average a scalar tensor over ranks (gloo has no AVG, so SUM / size)."""
    if world.size <= 1:
        return value
    value = value.clone()
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.SUM)
    return value / world.size
