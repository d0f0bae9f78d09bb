"""The device a process trains on, what it supports (bf16, flash-attn), seeding, and torch.compile."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ..core.errors import X1Error

Log = Callable[[str], None]


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str, local_rank: int = 0, world_size: int = 1) -> Any:
    """The device of this process; under torchrun on GPUs, the GPU of its local rank."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" or (world_size > 1 and name.startswith("cuda")):
        name = f"cuda:{local_rank}"  # each rank its own GPU; set_device needs an index
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise X1Error(f"train.device {name!r}: no CUDA device is visible (torch {torch.__version__}, "
                      f"CUDA build {torch.version.cuda}); use --device cpu or check nvidia-smi")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def hardware_plan(cfg: Any, device: Any, log: Log) -> bool:
    """Check precision/attention against the device; returns whether flash-attn will be used."""
    import torch

    from ..model.transformer import flash_available

    # Ampere (compute capability 8.0) or newer: is_bf16_supported() also counts emulated bf16 on older GPUs,
    # and flash-attn 2 refuses them at the first forward.
    ampere = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)
    if cfg.train.precision == "bf16" and device.type == "cuda" and not ampere:
        raise X1Error(f"train.precision 'bf16': {torch.cuda.get_device_name(device)} has no bf16 support; "
                      "use --set train.precision=fp32 (slower) or an Ampere-or-newer GPU")
    if cfg.train.attention != "flash":
        return False
    if device.type != "cuda":
        log("warning: train.attention 'flash' needs a CUDA device; using PyTorch SDPA on the CPU")
        return False
    if not ampere:
        log(f"warning: flash-attn needs an Ampere-or-newer GPU ({torch.cuda.get_device_name(device)} is older); "
            "using PyTorch SDPA")
        return False
    if not flash_available():
        log("warning: flash-attn is not importable (pip install flash-attn==2.6.3 --no-build-isolation, or use "
            "nvcr.io/nvidia/pytorch:24.10-py3); falling back to PyTorch SDPA")
        return False
    if cfg.train.precision != "bf16":
        log("warning: flash-attn needs bf16/fp16 tensors; with train.precision fp32 attention uses SDPA")
        return False
    return True


class CompileFallback:
    """Calls the compiled model; if compilation fails, warns once and carries on eagerly."""

    def __init__(self, compiled: Any, eager: Any, log: Log) -> None:
        self.compiled, self.eager, self.log = compiled, eager, log
        self.failed = False

    def __call__(self, *a: Any, **k: Any) -> Any:
        if self.failed:
            return self.eager(*a, **k)
        try:
            return self.compiled(*a, **k)
        except Exception as e:  # torch._dynamo / inductor raise many types
            if "out of memory" in str(e).lower():
                raise
            self.failed = True
            self.log(f"warning: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                     "continuing eagerly (set --no-compile to skip compilation)")
            return self.eager(*a, **k)

    def train(self, mode: bool = True) -> Any:
        return self.eager.train(mode)

    def eval(self) -> Any:
        return self.eager.eval()
