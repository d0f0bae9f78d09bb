"""Data parallelism with PyTorch's own stack: torchrun sets the environment, DDP syncs gradients.

Rank 0 alone logs to MLflow, writes checkpoints and talks to the budget guard; whatever it decides, and
any rank's signal, is agreed on by every rank after each step (one tiny all-reduce), so all ranks stop
together at the same step. Ranks may sit on several machines with disks of their own: the newest checkpoint
any rank finds is the one every rank resumes (sent over the process group to a rank whose disk lacks it), and
rank 0's exit code is the one every rank ends with, so each node's watchdog acts on the run's outcome.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.fileio import inside


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


def from_rank(value: Any, world: World, src: int = 0) -> Any:
    """Rank ``src``'s ``value`` (a small picklable object) on every rank."""
    if world.size <= 1:
        return value
    box = [value if world.rank == src else None]
    torch.distributed.broadcast_object_list(box, src=src)
    return box[0]


def gather_all(value: Any, world: World) -> list[Any]:
    """Every rank's ``value`` (small, picklable), in rank order, on every rank."""
    if world.size <= 1:
        return [value]
    out: list[Any] = [None] * world.size
    torch.distributed.all_gather_object(out, value)
    return out


SEND_CHUNK = 64 << 20  # bytes a broadcast carries: a file goes in pieces, never whole in memory


def send_files(src: Path | None, dest: Path | None, world: World, device: Any, sender: int = 0) -> None:
    """Rank ``sender``'s files in its folder ``src`` written into ``dest`` on every rank that gives one (a rank
    with ``dest`` None takes part and keeps nothing). Collective: every rank calls it."""
    sending = world.rank == sender and src is not None
    listing = from_rank(
        sorted((p.name, p.stat().st_size) for p in src.iterdir() if p.is_file())
        if sending and src is not None
        else None,
        world,
        sender,
    )
    if dest is not None:
        dest.mkdir(parents=True, exist_ok=True)
    root = dest if dest is not None else (src if src is not None else Path.cwd())
    for name, _ in listing:  # a name from another machine, checked on every rank (all stop together, no hang)
        inside(root, name, f"rank {sender} sent a file named", "not a checkpoint file x1 writes")
    for name, size in listing:
        with contextlib.ExitStack() as files:
            reader = files.enter_context(open(src / name, "rb")) if sending and src is not None else None
            writer = files.enter_context(open(dest / name, "wb")) if dest is not None and not sending else None
            for offset in range(0, size, SEND_CHUNK):
                n = min(SEND_CHUNK, size - offset)
                if reader is not None:
                    buf = torch.frombuffer(bytearray(reader.read(n)), dtype=torch.uint8).to(device)
                else:
                    buf = torch.empty(n, dtype=torch.uint8, device=device)
                torch.distributed.broadcast(buf, src=sender)
                if writer is not None:
                    writer.write(buf.cpu().numpy().tobytes())
            if writer is not None:
                writer.flush()
                os.fsync(writer.fileno())


# What a collective raises when another rank is gone: its process died, its machine was lost or stopped.
PEER_LOST_SIGNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "nccl communicator was aborted",
    "timed out waiting",
)


def peer_lost(e: BaseException) -> bool:
    """Whether ``e`` is a collective that failed because another rank is gone: a closed or reset connection, an
    aborted NCCL communicator or a collective that timed out (torch's own exception types are not specific enough:
    NCCL reports a missing /dev/shm as a DistBackendError too)."""
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(sign in text for sign in PEER_LOST_SIGNS)
