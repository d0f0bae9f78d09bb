"""Token files: validation at start, a deterministic batch-at-step sampler, and a prefetch thread.

Windows: a split of N tokens holds ``(N - 1) // seq_len`` windows of ``seq_len + 1`` tokens starting
at multiples of ``seq_len`` (inputs never overlap; every token is a target exactly once per epoch).
Each epoch visits every window once in an order drawn from ``(seed, epoch)``. The batch of a given
(step, chunk) is a pure function of (seed, step, chunk), so a resumed run rebuilds it from the step.
A *chunk* is one micro-batch of the global step: ``batch_size / micro_batch_size`` chunks per step,
shared out over grad-accumulation micro-steps (and, with several ranks, over ranks).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.errors import DataError
from ..core.fileio import write_text_atomic
from .tokenizer import GPT2_TIKTOKEN_SHA256

_SAMPLE_SLICES = 64
_SAMPLE_LEN = 16384
_SCAN_CHUNK = 1 << 25  # tokens per chunk of the full id scan (64 MB)


@dataclass(frozen=True)
class TokenData:
    """The two memory-mapped splits of a ``tokenize_data`` output directory."""

    directory: Path
    train: np.ndarray
    val: np.ndarray
    meta: dict[str, Any]

    @property
    def identity(self) -> str:
        """sha256 of what the tokens are (sources, sizes, split, tokenizer, counts), not of when they were
        made: re-tokenizing the same inputs the same way gives the same identity."""
        m = self.meta
        keep = {
            "vocab_size": m.get("vocab_size"),
            "eot_id": m.get("eot_id"),
            "splits": m.get("splits"),
            "tokenizer_sha256": m.get("tokenizer_sha256"),
            "val_fraction": m.get("val_fraction"),
            "text_column": m.get("text_column"),
            "sources": [[s.get("path"), s.get("bytes")] for s in m.get("sources", [])],
        }
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()

    @property
    def tokenizer_sha256(self) -> str:
        return tokenizer_hash(self.meta)


UINT16_MAX_VOCAB = 65535  # bins are uint16 up to this vocab size, uint32 above it
DTYPES = ("uint16", "uint32")


def bins_dtype(vocab_size: int) -> type[np.unsignedinteger[Any]]:
    """The bins' element type for a tokenizer of ``vocab_size`` ids."""
    return np.uint16 if vocab_size <= UINT16_MAX_VOCAB else np.uint32


def tokenizer_hash(meta: dict[str, Any]) -> str:
    """Which tokenizer made the ids: the sha256 of its file (GPT-2's: of the hash-checked ranks, however it was
    loaded)."""
    if meta.get("tokenizer", "gpt2") == "gpt2":
        return GPT2_TIKTOKEN_SHA256
    return str(meta.get("tokenizer_sha256"))


def file_key(path: Path) -> dict[str, int]:
    """What a validation result is keyed by: the file's size and modification time (any rewrite changes them)."""
    st = path.stat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def scan_max_id(tokens: np.ndarray, path: Path, vocab_size: int) -> int:
    """The largest id in the whole file, read in chunks (a vectorised max runs at GB/s: seconds for 20 GB).
    An id >= ``vocab_size`` raises a DataError naming the file, the token offset, the id and the vocab."""
    top = -1
    for start in range(0, tokens.size, _SCAN_CHUNK):
        part = np.asarray(tokens[start : start + _SCAN_CHUNK])
        m = int(part.max())
        if m >= vocab_size:
            off = start + int(np.argmax(part >= vocab_size))
            raise DataError(
                f"{path}: token id {int(tokens[off])} at token offset {off:,} (byte {tokens.itemsize * off:,}) is out "
                f"of range for model.vocab_size {vocab_size}; the file was made with another tokenizer "
                "or is damaged (re-tokenize it), or model.vocab_size is wrong"
            )
        top = max(top, m)
    return top


def _validate_ids(tokens: np.ndarray, path: Path, split: str, vocab_size: int, meta: dict[str, Any]) -> bool:
    """Every id checked once: a result recorded in meta.json for this file's size and mtime is reused, else the
    file is scanned. Returns True when meta.json gained a new record to save."""
    key = file_key(path)
    known = (meta.get("validated") or {}).get(split)
    if (
        isinstance(known, dict)
        and all(known.get(k) == v for k, v in key.items())
        and isinstance(known.get("max_id"), int)
        and known["max_id"] < vocab_size
    ):
        return False
    top = scan_max_id(tokens, path, vocab_size)
    meta.setdefault("validated", {})[split] = {**key, "max_id": top}
    return True


def _check_sample(tokens: np.ndarray, path: Path, eot_id: int | None) -> None:
    n = tokens.size
    if n == 0:
        return
    starts = np.linspace(0, max(n - _SAMPLE_LEN, 0), _SAMPLE_SLICES).astype(np.int64)
    sample = np.concatenate([np.asarray(tokens[s : s + _SAMPLE_LEN]) for s in np.unique(starts)])
    if eot_id is not None and not (sample == eot_id).any():
        raise DataError(
            f"{path}: no end-of-text token {eot_id} in a sample of {sample.size:,} tokens; "
            "this does not look like a tokenize_data output (documents end with EOT)"
        )


def _check_vocab(meta: dict[str, Any], meta_path: Path, vocab_size: int) -> None:
    """The model must have a row for every id the tokenizer makes; more rows than that are a config slip too."""
    data_vocab = meta.get("vocab_size")
    if data_vocab == vocab_size:
        return
    largest = max((s.get("max_id", -1) for s in (meta.get("splits") or {}).values() if isinstance(s, dict)), default=-1)
    seen = f" (its largest id in the bins: {largest:,})" if isinstance(largest, int) and largest >= 0 else ""
    if isinstance(data_vocab, int) and vocab_size < data_vocab:
        raise DataError(
            f"model.vocab_size {vocab_size:,} is smaller than the data's tokenizer: {meta_path} says vocab_size "
            f"{data_vocab:,}{seen}; the model would index past its embedding\n"
            f"  hint: set model.vocab_size: auto (or --set model.vocab_size={data_vocab}) to take the data's"
        )
    raise DataError(
        f"{meta_path}: vocab_size {data_vocab} does not match model.vocab_size {vocab_size}{seen}; tokenize with "
        "the model's tokenizer, or set model.vocab_size: auto to take the data's"
    )


def open_token_data(data_dir: str | Path, vocab_size: int, seq_len: int) -> TokenData:
    """Memory-map and validate ``train.bin``/``val.bin`` against ``meta.json`` and the model config."""
    d = Path(data_dir)
    hint = f"run: python -m x1_pretrain.tokenize_data --input-dir RAW --output-dir {d}"
    if not d.is_dir():
        raise DataError(f"--data-dir {d} does not exist; {hint}")
    meta_path = d / "meta.json"
    if not meta_path.is_file():
        raise DataError(f"{meta_path} is missing: {d} is not a finished tokenize_data output; {hint}")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DataError(f"{meta_path}: cannot be read as JSON ({e}); {hint}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}; {hint}")
    _check_vocab(meta, meta_path, vocab_size)
    dtype_name = meta.get("dtype", "uint16")
    if dtype_name not in DTYPES:
        raise DataError(
            f"{meta_path}: dtype {dtype_name!r} is not one of {', '.join(DTYPES)}; re-tokenize with tokenize_data"
        )
    dtype = np.dtype(dtype_name)
    eot = meta.get("eot_id")
    splits = {}
    changed = False
    for split in ("train", "val"):
        path = d / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"{path} is missing; {hint}")
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise DataError(
                f"{path}: {size} bytes is not a whole number of {dtype_name} tokens ({dtype.itemsize} bytes "
                "each): a truncated copy?"
            )
        want = meta.get("splits", {}).get(split, {}).get("tokens")
        if want is not None and want * dtype.itemsize != size:
            raise DataError(
                f"{path}: {size // dtype.itemsize:,} tokens but meta.json says {want:,}; the files do not belong "
                f"together (re-copy the directory or re-tokenize)"
            )
        tokens = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
        if tokens.size < seq_len + 1:
            raise DataError(
                f"{path}: {tokens.size:,} tokens is fewer than one window of model.seq_len + 1 = "
                f"{seq_len + 1}"
                + (
                    "; re-tokenize with a larger --val-fraction"
                    if split == "val"
                    else "; use more data or a shorter model.seq_len"
                )
            )
        _check_sample(tokens, path, eot if isinstance(eot, int) else None)
        changed = _validate_ids(tokens, path, split, vocab_size, meta) or changed
        splits[split] = tokens
    if changed:
        with contextlib.suppress(OSError):  # a cache: a read-only data dir is scanned at every start instead
            write_text_atomic(meta_path, json.dumps(meta, indent=2) + "\n")
    return TokenData(d, splits["train"], splits["val"], meta)


class Sampler:
    """Window starts for (step, chunk): a pure function of (seed, step, chunk)."""

    def __init__(self, n_tokens: int, seq_len: int, seed: int, micro_batch_size: int, chunks_per_step: int) -> None:
        self.seq_len = seq_len
        self.n_windows = (n_tokens - 1) // seq_len
        self.seed = seed
        self.micro = micro_batch_size
        self.chunks = chunks_per_step
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            self._perms = {epoch: perm, **{e: p for e, p in self._perms.items() if e == epoch - 1}}
        return perm

    def starts(self, step: int, chunk: int) -> np.ndarray:
        """Token offsets of the micro_batch_size windows of this chunk."""
        g = (step * self.chunks + chunk) * self.micro + np.arange(self.micro, dtype=np.int64)
        epochs, pos = np.divmod(g, self.n_windows)
        out = np.empty(self.micro, dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self.permutation(int(e))[pos[sel]]
        return out * self.seq_len

    def epoch_of(self, step: int) -> float:
        return step * self.chunks * self.micro / self.n_windows


def gather(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (B, T) as contiguous int64 tensors (views of one (B, T+1) array would make the
    pinned copy and the host-to-device transfer of each a strided, synchronous one)."""
    rows = np.stack([np.asarray(tokens[s : s + seq_len + 1]) for s in starts]).astype(np.int64)
    t = torch.from_numpy(rows)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def val_starts(n_tokens: int, seq_len: int, count: int) -> np.ndarray:
    """A fixed, evenly spread set of val windows (the same at every eval)."""
    n = (n_tokens - 1) // seq_len
    return np.unique(np.linspace(0, n - 1, min(count, n)).astype(np.int64)) * seq_len


@dataclass
class Batch:
    step: int
    chunk: int
    x: torch.Tensor
    y: torch.Tensor


class Prefetcher:
    """Prepares the batches of (step, chunk) for steps ``start..end-1`` in a background thread.

    Batches come out in order; on CUDA they are pinned so the copy to the GPU is asynchronous.
    """

    def __init__(
        self, tokens: np.ndarray, sampler: Sampler, chunks: list[int], start: int, end: int, depth: int, pin: bool
    ) -> None:
        self._tokens, self._sampler, self._chunks = tokens, sampler, chunks
        self._start, self._end, self._pin = start, end, pin
        self._q: queue.Queue[Batch | BaseException | None] = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="x1-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for step in range(self._start, self._end):
                for c in self._chunks:
                    x, y = gather(self._tokens, self._sampler.starts(step, c), self._sampler.seq_len)
                    if self._pin:
                        x, y = x.pin_memory(), y.pin_memory()
                    while not self._stop.is_set():
                        try:
                            self._q.put(Batch(step, c, x, y), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if self._stop.is_set():
                        return
            self._q.put(None)
        except BaseException as e:  # surfaced in the consumer, never lost in the thread
            self._q.put(e)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            item = self._q.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
