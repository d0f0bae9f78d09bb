"""Facts about the software and machine, recorded in MLflow, checkpoints and the run manifest."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from typing import Any

from .. import __version__


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": _version("numpy"),
        "flash_attn": _version("flash-attn") or _version("flash_attn"),
        "transformers": _version("transformers"),
        "mlflow": _version("mlflow-skinny") or _version("mlflow"),
        "tiktoken": _version("tiktoken"),
        "safetensors": _version("safetensors"),
        "x1_pretrain": __version__,
    }


def device_name(device: Any) -> str:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python_executable": sys.executable,
    }
    try:
        info["ram_gb"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        info["ram_gb"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu_name=props.name, gpu_count=torch.cuda.device_count(), gpu_memory_gb=round(props.total_memory / 2**30, 1)
        )
    else:
        info.update(gpu_name=None, gpu_count=0, gpu_memory_gb=None)
    return info


def keep_freed_memory() -> bool:
    """On glibc, keep freed memory in the heap instead of returning it to the kernel at once.

    A CPU step allocates and frees tensors of hundreds of MB (the logits over 50,257 tokens); glibc serves
    each of those with a fresh mmap and unmaps it on free, so every step page-faults the whole buffer in
    again: on the 2-core dev machine most of a tiny-config step was kernel time. With mmap off and a high
    trim threshold the same memory is reused (docs/performance.md: the tiny step takes ~0.55x the time).
    Returns whether the allocator was tuned (False off glibc)."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):
        return False
