"""A deterministic safetensors writer (the same tensors always give the same bytes).

The safetensors library orders its header by a hash map, so two saves of one state dict can differ
byte for byte across processes; the lab's DoD asks for a byte-identical round trip. This writer lays
tensors out in sorted-name order with a sorted JSON header. Reading uses the safetensors library.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> str:
    """Write ``tensors`` to ``path`` (fsynced); returns the file's sha256."""
    names = sorted(tensors)
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {k: str(metadata[k]) for k in sorted(metadata)}
    offset = 0
    cpu: list[torch.Tensor] = []
    for name in names:
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: dtype {t.dtype} cannot be stored in safetensors")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
        cpu.append(t)
    blob = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    blob += b" " * (-len(blob) % 8)  # the format allows space padding; 8-byte alignment of the data
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for chunk in (len(blob).to_bytes(8, "little"), blob):
            f.write(chunk)
            h.update(chunk)
        for t in cpu:
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            f.write(raw)
            h.update(raw)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def load(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})
