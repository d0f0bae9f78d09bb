"""Turn raw web-text shards into nanoGPT-format token files.

    python -m x1_pretrain.tokenize_data --input-dir DIR --output-dir DIR \\
        --tokenizer gpt2 --val-fraction 0.001 --workers 16

Output (in --output-dir): ``train.bin`` and ``val.bin`` (flat little-endian uint16, no header, each
document followed by one EOT 50256), ``unigram_counts.npy`` (int64 count of every token id in the
train split) and ``meta.json``, written last: a directory without ``meta.json`` is not a finished output.

The split is by document: a document goes to val when a hash of (source path relative to the input
dir, document index in that file) falls below --val-fraction, so val is spread over the whole corpus
and the output is byte-identical for any --workers. Memory stays bounded: documents stream through in
chunks and at most a few chunks per worker are in flight.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from . import __version__
from .errors import EXIT_OK, EXIT_UNEXPECTED, DataError, X1Error
from .fileio import fsync_dir
from .sources import BadShard, Progress, discover, iter_documents
from .tokenizer import EOT_ID, GPT2_VOCAB_SIZE, Tokenizer, load_gpt2

FORMAT_VERSION = 1
TRAIN_BIN, VAL_BIN, COUNTS, META = "train.bin", "val.bin", "unigram_counts.npy", "meta.json"
SPLIT_RULE = ("document goes to val iff int.from_bytes(blake2b(f'{relpath}:{doc_index}', digest_size=8), "
              "'little') < val_fraction * 2**64; relpath is relative to --input-dir, doc_index counts "
              "every document of the file from 0 (empty ones included)")
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


def _encode_one(enc: Any) -> Callable[[str], np.ndarray]:
    # encode_to_numpy skips the list-of-ints round trip; with no allowed special tokens it is
    # encode_ordinary (a literal "<|endoftext|>" in a document is ordinary text). Older tiktoken lacks it.
    if hasattr(enc, "encode_to_numpy"):
        return lambda text: enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())
    return lambda text: np.asarray(enc.encode_ordinary(text), dtype=np.uint32)


_EOT = np.array([EOT_ID], dtype=np.uint32)


def encode_chunk(tok: Tokenizer, chunk: Chunk, val_fraction: float) -> Encoded:
    encode = _encode_one(tok.encoding)
    train_parts: list[np.ndarray] = []
    val_parts: list[np.ndarray] = []
    n_train = n_val = n_empty = chars = 0
    for i, text in enumerate(chunk.texts):
        chars += len(text)
        if not text.strip():
            n_empty += 1
            continue
        parts = val_parts if is_val(chunk.relpath, chunk.first_doc + i, val_fraction) else train_parts
        parts.append(encode(text))
        parts.append(_EOT)
        if parts is val_parts:
            n_val += 1
        else:
            n_train += 1
    train = np.concatenate(train_parts).astype(np.uint16) if train_parts else np.empty(0, np.uint16)
    val = np.concatenate(val_parts).astype(np.uint16) if val_parts else np.empty(0, np.uint16)
    counts = np.bincount(train, minlength=GPT2_VOCAB_SIZE).astype(np.int64)
    return Encoded(chunk.seq, chunk.file_index, train, val, n_train, n_val, n_empty, counts, chars)


# --- worker processes -------------------------------------------------------------------------------
_WORKER: dict[str, Any] = {}


def _worker_init(tokenizer_file: str | None, val_fraction: float) -> None:
    _WORKER["tok"] = load_gpt2(tokenizer_file)
    _WORKER["val_fraction"] = val_fraction


def _worker_encode(chunk: Chunk) -> Encoded:
    return encode_chunk(_WORKER["tok"], chunk, _WORKER["val_fraction"])


# --- the pipeline -----------------------------------------------------------------------------------
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


@dataclass
class Totals:
    train_tokens: int = 0
    val_tokens: int = 0
    train_docs: int = 0
    val_docs: int = 0
    empty_docs: int = 0
    chars: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(GPT2_VOCAB_SIZE, np.int64))


class _Reporter:
    """A progress bar on a terminal, a plain log line every ``every_s`` seconds otherwise."""

    def __init__(self, total_bytes: int, stream: Any = None, every_s: float = 15.0) -> None:
        self.total = max(total_bytes, 1)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = 0.5 if self.tty else every_s
        self.t0 = time.monotonic()
        self.last = self.t0

    def update(self, done_bytes: float, docs: int, tokens: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        frac = min(done_bytes / self.total, 1.0)
        eta = dt * (1 - frac) / frac if frac > 0 else float("nan")
        eta_s = f"{eta / 60:5.1f} min" if eta == eta else "   ?   "
        msg = (f"{frac * 100:5.1f}% | {docs:,} docs | {tokens:,} tokens | {tokens / dt / 1e6:6.2f} M tok/s | "
               f"{done_bytes / dt / 1e6:6.1f} MB/s | ETA {eta_s}")
        if self.tty:
            print("\r[tokenize] " + msg, end="" if not force else "\n", file=self.stream, flush=True)
        else:
            print("[tokenize] " + msg, file=self.stream, flush=True)


def _fsync_close(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def fingerprint(sources: list[Path], input_dir: Path, args: argparse.Namespace, tok: Tokenizer) -> dict[str, Any]:
    """What the output depends on; a complete output with the same fingerprint is not redone."""
    return {
        "format_version": FORMAT_VERSION,
        "sources": [[p.relative_to(input_dir).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in sources],
        "val_fraction": args.val_fraction,
        "text_column": args.text_column,
        "tokenizer": tok.name,
        "tokenizer_sha256": tok.file_sha256,
        "skip_bad_files": bool(args.skip_bad_files),
    }


def _existing_state(out: Path, fp: dict[str, Any]) -> str:
    """'complete-same', 'complete-other' or 'absent' for the output directory."""
    meta_path = out / META
    if not meta_path.is_file():
        return "absent"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return "complete-other"
    for split, name in (("train", TRAIN_BIN), ("val", VAL_BIN)):
        want = meta.get("splits", {}).get(split, {}).get("tokens")
        f = out / name
        if want is None or not f.is_file() or f.stat().st_size != 2 * want:
            return "complete-other"
    return "complete-same" if meta.get("fingerprint") == fp else "complete-other"


@dataclass
class FileEnd:
    """Marker after the last chunk of a file: it ended cleanly (``error`` None) or was bad."""

    file_index: int
    documents: int
    error: BadShard | None = None


def _chunks(sources: list[Path], input_dir: Path, text_column: str, progress: Progress,
            on_file_start: Callable[[int], None]) -> Iterator[Chunk | FileEnd]:
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


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    t_start = time.monotonic()
    input_dir = Path(args.input_dir).resolve()
    out = Path(args.output_dir)
    if not 0.0 <= args.val_fraction < 1.0:
        raise DataError(f"--val-fraction {args.val_fraction} must be in [0, 1)")
    if args.workers < 1:
        raise DataError(f"--workers {args.workers} must be at least 1")
    sources = discover(input_dir)
    tok = load_gpt2(args.tokenizer_file)
    fp = fingerprint(sources, input_dir, args, tok)

    state = _existing_state(out, fp)
    if state == "complete-same" and not args.overwrite:
        log(f"{out} already holds a complete tokenization of these inputs with these settings; "
            "nothing to do (--overwrite to redo it)")
        return json.loads((out / META).read_text())
    if state == "complete-other" and not args.overwrite:
        raise DataError(f"{out} already holds a tokenization of other inputs or settings ({META} differs); "
                        "pass --overwrite to replace it, or choose another --output-dir")

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.partial-*"):
        stale.unlink(missing_ok=True)
    tmp = {name: out / f".{name}.partial-{os.getpid()}" for name in (TRAIN_BIN, VAL_BIN, COUNTS, META)}
    f_train = open(tmp[TRAIN_BIN], "wb")  # noqa: SIM115 (closed in finally/_fsync_close)
    f_val = open(tmp[VAL_BIN], "wb")  # noqa: SIM115
    files = [FileStats(p.relative_to(input_dir).as_posix(), p.stat().st_size) for p in sources]
    totals = Totals()
    skipped: list[dict[str, str]] = []
    file_good: set[int] = set()
    pending_counts: dict[int, np.ndarray] = {}  # unigram counts of files still being read
    file_start: dict[int, tuple[int, int]] = {}
    bytes_before = [0]
    progress = Progress()
    reporter = _Reporter(sum(f.bytes for f in files), every_s=args.log_every_s)
    cur_file = [0]

    def on_file_start(fi: int) -> None:
        cur_file[0] = fi
        bytes_before[0] = sum(f.bytes for f in files[:fi])

    def handle(res: Encoded) -> None:
        if res.file_index not in file_start:
            file_start[res.file_index] = (f_train.tell(), f_val.tell())
        f_train.write(res.train.tobytes())
        f_val.write(res.val.tobytes())
        fs = files[res.file_index]
        fs.train_docs += res.train_docs
        fs.val_docs += res.val_docs
        fs.empty_docs += res.empty_docs
        fs.train_tokens += res.train.size
        fs.val_tokens += res.val.size
        totals.chars += res.chars
        if res.file_index in file_good:
            totals.counts += res.counts
        else:
            pending_counts.setdefault(res.file_index, np.zeros(GPT2_VOCAB_SIZE, np.int64))
            pending_counts[res.file_index] += res.counts
        done = bytes_before[0] + progress.fraction * files[cur_file[0]].bytes
        reporter.update(done, sum(f.train_docs + f.val_docs for f in files),
                        sum(f.train_tokens + f.val_tokens for f in files))

    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = ctx.Pool(args.workers, _worker_init, (tok.source if tok.file_sha256 else None, args.val_fraction)) \
        if args.workers > 1 else None
    inflight: deque[Any] = deque()
    max_inflight = 2 * args.workers

    def submit(chunk: Chunk) -> None:
        if pool is None:
            handle(encode_chunk(tok, chunk, args.val_fraction))
            return
        inflight.append(pool.apply_async(_worker_encode, (chunk,)))
        while len(inflight) > max_inflight:
            handle(inflight.popleft().get())

    def drain() -> None:
        while inflight:
            handle(inflight.popleft().get())

    ok = False
    try:
        for item in _chunks(sources, input_dir, args.text_column, progress, on_file_start):
            if isinstance(item, Chunk):
                submit(item)
                continue
            fi = item.file_index
            if item.error is None:
                files[fi].documents = item.documents
                file_good.add(fi)
                if fi in pending_counts:
                    totals.counts += pending_counts.pop(fi)
                continue
            if not args.skip_bad_files:
                raise item.error
            drain()  # everything in flight belongs to this file or earlier ones
            if fi in file_start:  # roll back what this file had written
                for f, pos in zip((f_train, f_val), file_start[fi], strict=True):
                    f.seek(pos)
                    f.truncate(pos)
            pending_counts.pop(fi, None)
            files[fi] = FileStats(files[fi].path, files[fi].bytes)
            skipped.append({"path": files[fi].path,
                            "error": f"{item.error.where.strip() or 'file'}: {item.error.problem}"})
            log(f"skipped bad file {item.error}")
        drain()
        for fi in list(pending_counts):  # files that ended cleanly before their last chunk came back
            totals.counts += pending_counts.pop(fi)
        ok = True
    finally:
        if pool is not None:
            pool.terminate() if not ok else pool.close()
            pool.join()
        if not ok:
            f_train.close()
            f_val.close()
            for p in tmp.values():
                p.unlink(missing_ok=True)

    good = [fs for fs in files if fs.path not in {s["path"] for s in skipped}]
    if not any(fs.documents for fs in good):
        for p in tmp.values():
            p.unlink(missing_ok=True)
        raise DataError(f"no documents could be read from {input_dir}"
                        + (f" ({len(skipped)} bad files skipped)" if skipped else ""))
    for fs in good:
        totals.train_docs += fs.train_docs
        totals.val_docs += fs.val_docs
        totals.empty_docs += fs.empty_docs
        totals.train_tokens += fs.train_tokens
        totals.val_tokens += fs.val_tokens
    reporter.update(reporter.total, totals.train_docs + totals.val_docs,
                    totals.train_tokens + totals.val_tokens, force=True)
    _fsync_close(f_train)
    _fsync_close(f_val)
    with open(tmp[COUNTS], "wb") as f:
        np.save(f, totals.counts)
        f.flush()
        os.fsync(f.fileno())

    elapsed = time.monotonic() - t_start
    meta = {
        "format": "nanoGPT flat little-endian uint16, no header; each document followed by one EOT",
        "tokenizer": tok.name,
        "tokenizer_source": tok.source,
        "tokenizer_sha256": tok.file_sha256,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "dtype": "uint16",
        "splits": {
            "train": {"file": TRAIN_BIN, "tokens": totals.train_tokens, "documents": totals.train_docs},
            "val": {"file": VAL_BIN, "tokens": totals.val_tokens, "documents": totals.val_docs},
        },
        "empty_documents_skipped": totals.empty_docs,
        "unigram_counts": {"file": COUNTS, "split": "train", "dtype": "int64", "length": tok.vocab_size},
        "val_fraction": args.val_fraction,
        "split_rule": SPLIT_RULE,
        "text_column": args.text_column,
        "input_dir": str(input_dir),
        "sources": [vars(f) for f in files],
        "skipped_files": skipped,
        "characters": totals.chars,
        "x1_pretrain_version": __version__,
        "elapsed_s": round(elapsed, 3),
        "workers": args.workers,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fp,
    }
    with open(tmp[META], "w") as fm:
        json.dump(meta, fm, indent=2)
        fm.write("\n")
        fm.flush()
        os.fsync(fm.fileno())
    (out / META).unlink(missing_ok=True)  # from here until the last rename the output is "not finished"
    for name in (TRAIN_BIN, VAL_BIN, COUNTS, META):
        os.replace(tmp[name], out / name)
    fsync_dir(out)
    return meta


def summary(meta: dict[str, Any], out: Path) -> str:
    tr, va = meta["splits"]["train"], meta["splits"]["val"]
    total = tr["tokens"] + va["tokens"]
    rate = total / meta["elapsed_s"] if meta["elapsed_s"] else float("nan")
    lines = [
        f"[tokenize] output: {out}",
        f"  train.bin  {tr['tokens']:>14,} tokens  {tr['documents']:>10,} docs  {2 * tr['tokens'] / 1e6:10.2f} MB",
        f"  val.bin    {va['tokens']:>14,} tokens  {va['documents']:>10,} docs  {2 * va['tokens'] / 1e6:10.2f} MB",
        f"  empty documents skipped: {meta['empty_documents_skipped']:,}; "
        f"bad files skipped: {len(meta['skipped_files'])}",
        f"  {len(meta['sources'])} source files, {meta['elapsed_s']:.1f} s, {rate / 1e6:.2f} M tokens/s, "
        f"{total / max(tr['documents'] + va['documents'], 1):.0f} tokens/doc",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m x1_pretrain.tokenize_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input-dir", required=True, help="directory searched recursively for shards")
    p.add_argument("--output-dir", required=True, help="where train.bin, val.bin and meta.json go")
    p.add_argument("--tokenizer", default="gpt2", choices=["gpt2"], help="only GPT-2 BPE (50,257 tokens)")
    p.add_argument("--tokenizer-file", default=None, help="path to gpt2.tiktoken (else env/cache, see docs)")
    p.add_argument("--val-fraction", type=float, default=0.001, help="share of documents for val (default 0.001)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes")
    p.add_argument("--text-column", default="text", help="parquet column / JSON key holding the text")
    p.add_argument("--skip-bad-files", action="store_true",
                   help="skip unreadable shards (listed in the log and meta.json) instead of failing")
    p.add_argument("--overwrite", action="store_true", help="replace an existing complete output")
    p.add_argument("--log-every-s", type=float, default=15.0, help="seconds between log lines off a terminal")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def log(msg: str) -> None:
        print(f"[tokenize] {msg}", file=sys.stderr, flush=True)

    try:
        meta = run(args, log)
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted: no output was written", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNEXPECTED
    print(summary(meta, Path(args.output_dir)))
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
