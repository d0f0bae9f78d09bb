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
import os
import sys
from pathlib import Path

from .core.cli import guarded
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .data.pipeline import TokenizeJob, run, summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.tokenize_data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument("--input-dir", required=True, help="directory searched recursively for shards")
    p.add_argument("--output-dir", required=True, help="where train.bin, val.bin and meta.json go")
    p.add_argument("--tokenizer", default="gpt2", choices=["gpt2"], help="only GPT-2 BPE (50,257 tokens)")
    p.add_argument("--tokenizer-file", default=None, help="path to gpt2.tiktoken (else env/cache, see docs)")
    p.add_argument("--val-fraction", type=float, default=0.001, help="share of documents for val (default 0.001)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizer processes")
    p.add_argument("--text-column", default="text", help="parquet column / JSON key holding the text")
    p.add_argument(
        "--skip-bad-files",
        action="store_true",
        help="skip unreadable shards (listed in the log and meta.json) instead of failing",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing complete output")
    p.add_argument("--log-every-s", type=float, default=15.0, help="seconds between log lines off a terminal")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    job = TokenizeJob(
        Path(args.input_dir),
        Path(args.output_dir),
        args.tokenizer_file,
        args.val_fraction,
        args.workers,
        args.text_column,
        args.skip_bad_files,
        args.overwrite,
        args.log_every_s,
    )

    def log(msg: str) -> None:
        print(f"[tokenize] {msg}", file=sys.stderr, flush=True)

    def body() -> int:
        try:
            meta = run(job, log)
        except KeyboardInterrupt:
            print("interrupted: no output was written", file=sys.stderr)
            return 130
        print(summary(meta, job.output_dir))
        return 0

    return guarded(body, os_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
