"""The tokenize pipeline behind ``tokenize_data``: shards stream through the BPE (a process pool when
workers > 1) in order into partial files, a bad file can be rolled back, and ``meta.json`` is renamed into
place last. Output format and split rule: see ``tokenize_data.py``."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .. import __version__
from ..core.errors import DataError
from ..core.fileio import fsync_dir
from . import hf_tokenizer
from .sources import BadShard, Progress, discover, iter_documents
from .tokenizer import EOT_TEXT, load_gpt2
from .tokens import DTYPES, bins_dtype, file_key

FORMAT_VERSION = 1
TRAIN_BIN, VAL_BIN, COUNTS, META = "train.bin", "val.bin", "unigram_counts.npy", "meta.json"
TOKENIZER_JSON = "tokenizer.json"  # the tokenizer that made the bins, as a Hugging Face tokenizers file
_OUTPUTS = (TRAIN_BIN, VAL_BIN, COUNTS, TOKENIZER_JSON, META)  # renamed into place in this order: meta last
SPLIT_RULE = (
    "document goes to val iff int.from_bytes(blake2b(f'{relpath}:{doc_index}', digest_size=8), "
    "'little') < val_fraction * 2**64; relpath is relative to --input-dir, doc_index counts "
    "every document of the file from 0 (empty ones included)"
)
CHUNK_CHARS = 1 << 21  # ~2 MB of text per task: big enough to amortise IPC, small enough to bound memory


def is_val(relpath: str, doc_index: int, val_fraction: float) -> bool:
    digest = hashlib.blake2b(f"{relpath}:{doc_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < val_fraction * 2.0**64


@dataclass
class Chunk:
    seq: int
    file_index: int
    relpath: str
    first_doc: int
    texts: list[str]


@dataclass
class Encoded:
    seq: int
    file_index: int
    train: np.ndarray
    val: np.ndarray
    train_docs: int
    val_docs: int
    empty_docs: int
    counts: np.ndarray
    chars: int


def encode_chunk(tok: Any, chunk: Chunk, val_fraction: float) -> Encoded:
    eot = np.array([tok.eot_id], dtype=np.uint32)
    dtype = bins_dtype(tok.vocab_size)
    train_parts: list[np.ndarray] = []
    val_parts: list[np.ndarray] = []
    n_train = n_val = n_empty = chars = 0
    for i, text in enumerate(chunk.texts):
        chars += len(text)
        if not text.strip():
            n_empty += 1
            continue
        parts = val_parts if is_val(chunk.relpath, chunk.first_doc + i, val_fraction) else train_parts
        parts.append(tok.encode_array(text))
        parts.append(eot)
        if parts is val_parts:
            n_val += 1
        else:
            n_train += 1
    train = np.concatenate(train_parts).astype(dtype) if train_parts else np.empty(0, dtype)
    val = np.concatenate(val_parts).astype(dtype) if val_parts else np.empty(0, dtype)
    counts = np.bincount(train, minlength=tok.vocab_size).astype(np.int64)
    return Encoded(chunk.seq, chunk.file_index, train, val, n_train, n_val, n_empty, counts, chars)


# --- worker processes -------------------------------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _worker_init(spec: tuple[str, ...], val_fraction: float) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread a worker: the pool is the parallelism
    _WORKER["tok"] = hf_tokenizer.from_spec(spec)
    _WORKER["val_fraction"] = val_fraction


def _worker_encode(chunk: Chunk) -> Encoded:
    return encode_chunk(_WORKER["tok"], chunk, _WORKER["val_fraction"])


# --- the pipeline -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenizeJob:
    """One ``tokenize_data`` invocation (its flags)."""

    input_dir: Path
    output_dir: Path
    tokenizer_file: str | None = None  # GPT-2's gpt2.tiktoken (--tokenizer-file)
    tokenizer: str = "gpt2"  # "gpt2" or the path of a tokenizer.json
    train_vocab: int | None = None  # --train-tokenizer --vocab-size N
    eot_token: str = EOT_TEXT
    val_fraction: float = 0.001
    workers: int = 1
    text_column: str = "text"
    skip_bad_files: bool = False
    overwrite: bool = False
    log_every_s: float = 15.0


@dataclass
class FileStats:
    path: str
    bytes: int
    documents: int = 0
    train_docs: int = 0
    val_docs: int = 0
    empty_docs: int = 0
    train_tokens: int = 0
    val_tokens: int = 0


class _Reporter:
    """tqdm's progress bar on a terminal; off a terminal (a log file, CI) a plain line every ``every_s``."""

    def __init__(self, total_bytes: int, stream: Any = None, every_s: float = 15.0) -> None:
        self.total = max(total_bytes, 1)
        self.stream = stream or sys.stderr
        self.every = every_s
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total,
                unit="B",
                unit_scale=True,
                file=self.stream,
                desc="[tokenize]",
                mininterval=0.5,
                dynamic_ncols=True,
            )

    def update(self, done_bytes: float, docs: int, tokens: int, force: bool = False) -> None:
        now = time.monotonic()
        rate = tokens / max(now - self.t0, 1e-9) / 1e6
        if self.bar is not None:
            self.bar.update(max(min(done_bytes, self.total) - self.bar.n, 0))
            self.bar.set_postfix_str(f"{docs:,} docs, {tokens:,} tokens, {rate:.2f} M tok/s", refresh=force)
            if force:
                self.bar.close()
            return
        if not force and now - self.last < self.every:
            return
        self.last = now
        frac = min(done_bytes / self.total, 1.0)
        eta = (now - self.t0) * (1 - frac) / frac if frac > 0 else float("nan")
        eta_s = f"{eta / 60:5.1f} min" if eta == eta else "   ?   "
        print(
            f"[tokenize] {frac * 100:5.1f}% | {docs:,} docs | {tokens:,} tokens | {rate:6.2f} M tok/s | ETA {eta_s}",
            file=self.stream,
            flush=True,
        )


def _fsync_close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def fingerprint(sources: list[Path], input_dir: Path, job: TokenizeJob, tok: Any) -> dict[str, Any]:
    """What the output depends on; a complete output with the same fingerprint is not redone. A tokenizer trained
    here is named by its recipe (training is deterministic): the check comes before the training."""
    fp = {
        "format_version": FORMAT_VERSION,
        "sources": [[p.relative_to(input_dir).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in sources],
        "val_fraction": job.val_fraction,
        "text_column": job.text_column,
        "tokenizer": tok.name if tok is not None else "trained-bpe",
        "tokenizer_sha256": tok.file_sha256 if tok is not None else None,
        "skip_bad_files": bool(job.skip_bad_files),
    }
    if tok is None:
        fp["train_vocab"] = job.train_vocab
    if tok is None or tok.name != "gpt2":  # GPT-2's fingerprint is what it was before other tokenizers existed
        fp["eot_token"] = job.eot_token
    return fp


def _existing_state(out: Path, fp: dict[str, Any]) -> str:
    """'complete-same', 'complete-other' or 'absent' for the output directory."""
    meta_path = out / META
    if not meta_path.is_file():
        return "absent"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return "complete-other"
    dtype = meta.get("dtype", "uint16")
    itemsize = np.dtype(dtype).itemsize if dtype in DTYPES else 0
    for split, name in (("train", TRAIN_BIN), ("val", VAL_BIN)):
        want = meta.get("splits", {}).get(split, {}).get("tokens")
        f = out / name
        if want is None or not f.is_file() or f.stat().st_size != itemsize * want:
            return "complete-other"
    return "complete-same" if meta.get("fingerprint") == fp else "complete-other"


@dataclass
class FileEnd:
    """Marker after the last chunk of a file: it ended cleanly (``error`` None) or was bad."""

    file_index: int
    documents: int
    error: BadShard | None = None


def _chunks(
    sources: list[Path], input_dir: Path, text_column: str, progress: Progress, on_file_start: Callable[[int], None]
) -> Iterator[Chunk | FileEnd]:
    seq = 0
    for fi, path in enumerate(sources):
        on_file_start(fi)
        rel = path.relative_to(input_dir).as_posix()
        texts: list[str] = []
        size = first = n = 0
        try:
            for text in iter_documents(path, text_column, progress):
                texts.append(text)
                size += len(text)
                n += 1
                if size >= CHUNK_CHARS:
                    yield Chunk(seq, fi, rel, first, texts)
                    seq += 1
                    first, texts, size = n, [], 0
        except BadShard as e:
            yield FileEnd(fi, n, e)
            continue
        if texts:
            yield Chunk(seq, fi, rel, first, texts)
            seq += 1
        yield FileEnd(fi, n)


class _Output:
    """The partial output files and the running statistics; rolls a bad file back, writes meta last."""

    def __init__(self, out: Path, files: list[FileStats], reporter: _Reporter, progress: Progress, vocab: int) -> None:
        self.out, self.files, self.reporter, self.progress = out, files, reporter, progress
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob(".*.partial-*"):
            stale.unlink(missing_ok=True)
        self.tmp = {name: out / f".{name}.partial-{os.getpid()}" for name in _OUTPUTS}
        self.f_train = open(self.tmp[TRAIN_BIN], "wb")  # noqa: SIM115 (closed by finish/discard)
        self.f_val = open(self.tmp[VAL_BIN], "wb")  # noqa: SIM115
        self.vocab = vocab
        self.counts = np.zeros(vocab, np.int64)
        self.pending: dict[int, np.ndarray] = {}  # unigram counts of files still being read
        self.good: set[int] = set()
        self.start: dict[int, tuple[int, int]] = {}
        self.skipped: list[dict[str, str]] = []
        self.chars = 0
        self.max_id = {"train": -1, "val": -1}
        self.cur_file, self.bytes_before = 0, 0

    def file_started(self, fi: int) -> None:
        self.cur_file, self.bytes_before = fi, sum(f.bytes for f in self.files[:fi])

    def add(self, res: Encoded) -> None:
        if res.file_index not in self.start:
            self.start[res.file_index] = (self.f_train.tell(), self.f_val.tell())
        self.f_train.write(res.train.tobytes())
        self.f_val.write(res.val.tobytes())
        fs = self.files[res.file_index]
        fs.train_docs += res.train_docs
        fs.val_docs += res.val_docs
        fs.empty_docs += res.empty_docs
        fs.train_tokens += res.train.size
        fs.val_tokens += res.val.size
        self.chars += res.chars
        for split, arr in (("train", res.train), ("val", res.val)):
            if arr.size:
                self.max_id[split] = max(self.max_id[split], int(arr.max()))
        if res.file_index in self.good:
            self.counts += res.counts
        else:
            self.pending.setdefault(res.file_index, np.zeros(self.vocab, np.int64))
            self.pending[res.file_index] += res.counts
        done = self.bytes_before + self.progress.fraction * self.files[self.cur_file].bytes
        self.reporter.update(
            done,
            sum(f.train_docs + f.val_docs for f in self.files),
            sum(f.train_tokens + f.val_tokens for f in self.files),
        )

    def file_ended(self, fi: int, documents: int) -> None:
        self.files[fi].documents = documents
        self.good.add(fi)
        if fi in self.pending:
            self.counts += self.pending.pop(fi)

    def roll_back(self, fi: int, error: BadShard) -> str:
        """Forget everything a bad file wrote (everything in flight has been added already)."""
        if fi in self.start:
            for f, pos in zip((self.f_train, self.f_val), self.start[fi], strict=True):
                f.seek(pos)
                f.truncate(pos)
        self.pending.pop(fi, None)
        self.files[fi] = FileStats(self.files[fi].path, self.files[fi].bytes)
        self.skipped.append({"path": self.files[fi].path, "error": f"{error.where.strip() or 'file'}: {error.problem}"})
        return f"skipped bad file {error}"

    def discard(self) -> None:
        self.f_train.close()
        self.f_val.close()
        for p in self.tmp.values():
            p.unlink(missing_ok=True)

    def good_files(self) -> list[FileStats]:
        bad = {s["path"] for s in self.skipped}
        return [fs for fs in self.files if fs.path not in bad]

    def finish(self, meta: dict[str, Any], tokenizer_json: str) -> None:
        """Close and fsync the bins, counts and tokenizer, write meta.json, rename everything into place (meta
        last)."""
        for fi in list(self.pending):  # files that ended cleanly before their last chunk came back
            self.counts += self.pending.pop(fi)
        _fsync_close(self.f_train)
        _fsync_close(self.f_val)
        # the ids were all seen on the way in: the trainer's full scan is recorded as done for these exact files
        meta["validated"] = {
            split: {**file_key(self.tmp[name]), "max_id": self.max_id[split]}
            for split, name in (("train", TRAIN_BIN), ("val", VAL_BIN))
        }
        with open(self.tmp[COUNTS], "wb") as f:
            np.save(f, self.counts)
            f.flush()
            os.fsync(f.fileno())
        with open(self.tmp[TOKENIZER_JSON], "w", encoding="utf-8") as ft:
            ft.write(tokenizer_json)
            ft.flush()
            os.fsync(ft.fileno())
        with open(self.tmp[META], "w") as fm:
            json.dump(meta, fm, indent=2)
            fm.write("\n")
            fm.flush()
            os.fsync(fm.fileno())
        (self.out / META).unlink(missing_ok=True)  # from here until the last rename the output is "not finished"
        for name in _OUTPUTS:
            os.replace(self.tmp[name], self.out / name)
        fsync_dir(self.out)


def _encode_all(job: TokenizeJob, tok: Any, sources: list[Path], output: _Output, log: Callable[[str], None]) -> None:
    """Stream every shard through the encoder (a process pool when workers > 1), in order, into ``output``."""
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = ctx.Pool(job.workers, _worker_init, (hf_tokenizer.spec(tok), job.val_fraction)) if job.workers > 1 else None
    inflight: deque[Any] = deque()

    def drain(keep: int = 0) -> None:
        while len(inflight) > keep:
            output.add(inflight.popleft().get())

    ok = False
    try:
        for item in _chunks(sources, job.input_dir, job.text_column, output.progress, output.file_started):
            if isinstance(item, Chunk):
                if pool is None:
                    output.add(encode_chunk(tok, item, job.val_fraction))
                else:
                    inflight.append(pool.apply_async(_worker_encode, (item,)))
                    drain(keep=2 * job.workers)
            elif item.error is None:
                output.file_ended(item.file_index, item.documents)
            elif not job.skip_bad_files:
                raise item.error
            else:
                drain()  # everything in flight belongs to this file or earlier ones
                log(output.roll_back(item.file_index, item.error))
        drain()
        ok = True
    finally:
        if pool is not None:
            pool.terminate() if not ok else pool.close()
            pool.join()


def run(job: TokenizeJob, log: Callable[[str], None]) -> dict[str, Any]:
    """Tokenize ``job.input_dir`` into ``job.output_dir``; returns the meta.json written (or already there)."""
    t_start = time.monotonic()
    input_dir, out = Path(job.input_dir).resolve(), Path(job.output_dir)
    if not 0.0 <= job.val_fraction < 1.0:
        raise DataError(f"--val-fraction {job.val_fraction} must be in [0, 1)")
    if job.workers < 1:
        raise DataError(f"--workers {job.workers} must be at least 1")
    job = replace(job, input_dir=input_dir)
    sources = discover(input_dir)
    tok = _given_tokenizer(job)
    fp = fingerprint(sources, input_dir, job, tok)
    state = _existing_state(out, fp)
    if state == "complete-same" and not job.overwrite:
        log(
            f"{out} already holds a complete tokenization of these inputs with these settings; "
            "nothing to do (--overwrite to redo it)"
        )
        return json.loads((out / META).read_text())
    if state == "complete-other" and not job.overwrite:
        raise DataError(
            f"{out} already holds a tokenization of other inputs or settings ({META} differs); "
            "pass --overwrite to replace it, or choose another --output-dir"
        )
    if tok is None:
        tok = _train_tokenizer(job, sources, log)
    files = [FileStats(p.relative_to(input_dir).as_posix(), p.stat().st_size) for p in sources]
    reporter = _Reporter(sum(f.bytes for f in files), every_s=job.log_every_s)
    output = _Output(out, files, reporter, Progress(), tok.vocab_size)
    try:
        _encode_all(job, tok, sources, output, log)
        good = output.good_files()
        if not any(fs.documents for fs in good):
            raise DataError(
                f"no documents could be read from {input_dir}"
                + (f" ({len(output.skipped)} bad files skipped)" if output.skipped else "")
            )
    except BaseException:
        output.discard()
        raise
    totals = {
        k: sum(getattr(fs, k) for fs in good)
        for k in ("train_docs", "val_docs", "empty_docs", "train_tokens", "val_tokens")
    }
    output.reporter.update(
        output.reporter.total,
        totals["train_docs"] + totals["val_docs"],
        totals["train_tokens"] + totals["val_tokens"],
        force=True,
    )
    meta = _meta(job, tok, output, totals, fp)
    tok_json = tok.to_json()
    meta["tokenizer_json_sha256"] = hashlib.sha256(tok_json.encode("utf-8")).hexdigest()
    meta["elapsed_s"] = round(time.monotonic() - t_start, 3)
    output.finish(meta, tok_json)
    return meta


def _given_tokenizer(job: TokenizeJob) -> Any:
    """The tokenizer the flags name, or None when it is to be trained on the input (after the fingerprint check:
    a complete output of the same recipe is not trained again)."""
    if job.train_vocab is not None:
        return None
    if job.tokenizer == "gpt2":
        return load_gpt2(job.tokenizer_file)
    return hf_tokenizer.load_tokenizer_json(Path(job.tokenizer), job.eot_token)


def _train_tokenizer(job: TokenizeJob, sources: list[Path], log: Callable[[str], None]) -> Any:
    t0 = time.monotonic()
    want = int(job.train_vocab or 0)
    log(f"training a byte-level BPE of {want:,} ids on {len(sources)} files (one pass over the text)")

    def texts() -> Iterator[str]:
        for path in sources:
            try:
                for text in iter_documents(path, job.text_column):
                    if text.strip():
                        yield text
            except BadShard as e:  # its documents before the fault were seen: the same for the same input
                if not job.skip_bad_files:
                    raise
                log(f"tokenizer training: skipped the rest of bad file {e}")

    tty = getattr(sys.stderr, "isatty", lambda: False)()
    tok = hf_tokenizer.train_bpe(texts(), want, job.eot_token, show_progress=tty)
    short = f" (asked {want:,}: the text holds no more pairs seen twice)" if tok.vocab_size < want else ""
    log(f"trained {tok.vocab_size:,} ids in {time.monotonic() - t0:.1f} s{short}; sha256 {tok.file_sha256[:16]}…")
    return tok


def _meta(job: TokenizeJob, tok: Any, output: _Output, totals: dict[str, int], fp: dict[str, Any]) -> dict[str, Any]:
    dtype = np.dtype(bins_dtype(tok.vocab_size)).name
    return {
        "format": f"nanoGPT flat little-endian {dtype}, no header; each document followed by one EOT",
        "tokenizer": tok.name,
        "tokenizer_source": tok.source,
        "tokenizer_sha256": tok.file_sha256,
        "tokenizer_file": TOKENIZER_JSON,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "eot_token": tok.eot_text,
        "dtype": dtype,
        "splits": {
            "train": {
                "file": TRAIN_BIN,
                "tokens": totals["train_tokens"],
                "documents": totals["train_docs"],
                "max_id": output.max_id["train"],
            },
            "val": {
                "file": VAL_BIN,
                "tokens": totals["val_tokens"],
                "documents": totals["val_docs"],
                "max_id": output.max_id["val"],
            },
        },
        "empty_documents_skipped": totals["empty_docs"],
        "unigram_counts": {"file": COUNTS, "split": "train", "dtype": "int64", "length": tok.vocab_size},
        "val_fraction": job.val_fraction,
        "split_rule": SPLIT_RULE,
        "text_column": job.text_column,
        "input_dir": str(job.input_dir),
        "sources": [vars(f) for f in output.files],
        "skipped_files": output.skipped,
        "characters": output.chars,
        "x1_pretrain_version": __version__,
        "workers": job.workers,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fp,
    }


def summary(meta: dict[str, Any], out: Path) -> str:
    tr, va = meta["splits"]["train"], meta["splits"]["val"]
    total = tr["tokens"] + va["tokens"]
    itemsize = np.dtype(meta.get("dtype", "uint16")).itemsize

    def mb(split: dict[str, Any]) -> str:
        return f"{itemsize * split['tokens'] / 1e6:10.2f} MB"

    rate = total / meta["elapsed_s"] if meta["elapsed_s"] else float("nan")
    lines = [
        f"[tokenize] output: {out}",
        f"  train.bin  {tr['tokens']:>14,} tokens  {tr['documents']:>10,} docs  {mb(tr)}",
        f"  val.bin    {va['tokens']:>14,} tokens  {va['documents']:>10,} docs  {mb(va)}",
        f"  tokenizer: {meta['tokenizer']} ({meta['vocab_size']:,} ids, end of text {meta['eot_id']}, "
        f"{meta.get('dtype', 'uint16')} bins)",
        f"  empty documents skipped: {meta['empty_documents_skipped']:,}; "
        f"bad files skipped: {len(meta['skipped_files'])}",
        f"  {len(meta['sources'])} source files, {meta['elapsed_s']:.1f} s, {rate / 1e6:.2f} M tokens/s, "
        f"{total / max(tr['documents'] + va['documents'], 1):.0f} tokens/doc",
    ]
    return "\n".join(lines)
