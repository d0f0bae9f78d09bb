"""Tokenizer pipeline throughput against raw tiktoken, measured in one run on the same text.

    .venv/bin/python bench/tokenize_throughput.py [--mb 64] [--workers 1 2]

Reference: tiktoken's ``encode_ordinary_batch`` on one thread over the same documents (the raw BPE
speed of one core). Then ``tokenize_data`` end to end (reading parquet, splitting, encoding, writing,
unigram counts) with each worker count, in a child process whose peak RSS is read from the OS.
Prints tokens/s and ratio = pipeline tokens/s / (workers x raw single-core tokens/s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpus"


def corpus_documents() -> tuple[list[str], str]:
    docs: list[str] = []
    if SHARED_CORPUS.is_dir():
        from x1_pretrain.data.sources import discover, iter_documents

        for p in discover(SHARED_CORPUS):
            docs.extend(d for d in iter_documents(p) if d.strip())
        return docs, f"{SHARED_CORPUS} (FineWeb-Edu, DCLM, Dolma samples)"
    from x1_pretrain.data.demo_corpus import demo_documents

    return demo_documents(), "pydoc_data.topics"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=64.0, help="size of the text to tokenize (MB of UTF-8)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shards", type=int, default=8)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from x1_pretrain.data.tokenizer import load_gpt2

    base, origin = corpus_documents()
    target = int(args.mb * 1e6)
    docs: list[str] = []
    size = 0
    while size < target:
        for d in base:
            docs.append(d)
            size += len(d.encode())
            if size >= target:
                break
    tok = load_gpt2(allow_download=False)
    with tempfile.TemporaryDirectory(prefix="x1-bench-tok-") as tmp:
        inp = Path(tmp) / "in"
        inp.mkdir()
        per = (len(docs) + args.shards - 1) // args.shards
        for k in range(args.shards):
            pq.write_table(
                pa.table({"text": docs[k * per : (k + 1) * per]}),
                inp / f"shard{k:03d}.parquet",
                row_group_size=1000,
                compression="zstd",
            )

        # reference: raw tiktoken on one thread, same documents
        t0 = time.perf_counter()
        n_raw = 0
        for i in range(0, len(docs), 256):
            n_raw += sum(len(x) for x in tok.encoding.encode_ordinary_batch(docs[i : i + 256], num_threads=1))
        raw_s = time.perf_counter() - t0
        raw_tps = n_raw / raw_s
        print(f"input: {size / 1e6:.1f} MB, {len(docs):,} documents from {origin}, {args.shards} parquet shards")
        print(
            f"raw tiktoken encode_ordinary_batch, 1 thread: {n_raw:,} tokens in {raw_s:.2f} s = "
            f"{raw_tps / 1e6:.3f} M tokens/s"
        )
        rows = []
        for w in args.workers:
            out = Path(tmp) / f"out{w}"
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            t0 = time.perf_counter()
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "x1_pretrain.tokenize_data",
                    "--input-dir",
                    str(inp),
                    "--output-dir",
                    str(out),
                    "--val-fraction",
                    "0.001",
                    "--workers",
                    str(w),
                ],
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t0
            if r.returncode != 0:
                print(r.stderr)
                return 1
            peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            meta = json.loads((out / "meta.json").read_text())
            n = meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"]
            n_eot = meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"]
            tps = (n - n_eot) / wall  # compare like with like: the raw count has no EOTs
            ratio = tps / (w * raw_tps)
            rows.append((w, tps, ratio, max(peak_kb, before) / 1024))
            print(
                f"tokenize_data --workers {w}: {n:,} tokens in {wall:.2f} s (process start included) = "
                f"{tps / 1e6:.3f} M tokens/s; ratio vs {w} x raw = {ratio:.2f}; "
                f"peak RSS of largest process {peak_kb / 1024:.0f} MB"
            )
        print("\n| workers | pipeline M tok/s | ratio (target >= 0.8 at 2) | peak RSS MB |")
        print("|---|---|---|---|")
        for w, tps, ratio, rss in rows:
            print(f"| {w} | {tps / 1e6:.3f} | {ratio:.2f} | {rss:.0f} |")
        print(f"\ncpu count: {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
