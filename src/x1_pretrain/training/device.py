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


# Inductor modes that capture CUDA graphs, and the same mode without them. CUDA graphs under gradient
# accumulation overwrite their static outputs between micro-steps: "accessing tensor output of CUDAGraphs
# that has been overwritten" in backward, or silently wrong sums (pytorch/pytorch #169545, #96693).
WITHOUT_CUDA_GRAPHS = {"max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": "default"}


def effective_compile_mode(mode: str, micro_steps: int) -> tuple[str, str | None]:
    """(the mode to compile with, why it is not ``mode`` or None) for ``micro_steps`` per optimizer step."""
    if micro_steps > 1 and mode in WITHOUT_CUDA_GRAPHS:
        use = WITHOUT_CUDA_GRAPHS[mode]
        return use, (f"train.compile_mode {mode} captures CUDA graphs, which are not safe with gradient "
                     f"accumulation ({micro_steps} micro-steps per optimizer step; pytorch/pytorch#169545): "
                     f"compiling with {use}")
    return mode, None


class CompileFallback:
    """Calls the compiled model; if compilation fails, says so loudly (console, ``on_fallback`` for the MLflow
    tag and the alert) and carries on eagerly, which ``--min-tokens-per-s`` then judges."""

    def __init__(self, compiled: Any, eager: Any, log: Log, on_fallback: Callable[[str], None] | None = None) -> None:
        self.compiled, self.eager, self.log, self.on_fallback = compiled, eager, log, on_fallback
        self.failed: str | None = None

    def __call__(self, *a: Any, **k: Any) -> Any:
        if self.failed is not None:
            return self.eager(*a, **k)
        try:
            return self.compiled(*a, **k)
        except Exception as e:  # torch._dynamo / inductor raise many types
            if "out of memory" in str(e).lower():
                raise
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            self.log(f"WARNING: torch.compile failed ({self.failed}); training goes on EAGERLY, typically ~1.7x "
                     "slower on a GPU: fix the cause or relaunch with --no-compile (--min-tokens-per-s stops a run "
                     "that falls below the floor in its first hour)")
            if self.on_fallback is not None:
                try:
                    self.on_fallback(self.failed)
                except Exception as report_error:   # reporting must not end the run
                    self.log(f"warning: the compile fallback could not be reported ({report_error})")
            return self.eager(*a, **k)

    def train(self, mode: bool = True) -> Any:
        return self.eager.train(mode)

    def eval(self) -> Any:
        return self.eager.eval()
