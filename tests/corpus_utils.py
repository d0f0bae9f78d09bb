"""Helpers that write real shards (parquet, jsonl, zstd, gzip, txt) and read token files back."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np


def write_parquet(path: Path, texts: list, column: str = "text", row_group_size: int = 8) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: texts}), path, row_group_size=row_group_size)
    return path


def jsonl_bytes(texts: list[str], key: str = "text") -> bytes:
    return b"".join(json.dumps({key: t, "id": i}).encode() + b"\n" for i, t in enumerate(texts))


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = jsonl_bytes(texts)
    if path.name.endswith(".zst"):
        import zstandard

        # two frames, as concatenated .zst shards often are
        half = len(data) // 2
        c = zstandard.ZstdCompressor()
        data = c.compress(data[:half]) + c.compress(data[half:])
    elif path.name.endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def read_docs(out: Path, split: str, tok) -> list[str]:
    ids = np.memmap(out / f"{split}.bin", dtype=np.uint16, mode="r")
    assert ids.size == 0 or ids[-1] == 50256, "every document ends with EOT"
    ends = np.flatnonzero(ids == 50256)
    docs, start = [], 0
    for end in ends:
        docs.append(tok.decode(ids[start:end].tolist()))
        start = end + 1
    return docs
