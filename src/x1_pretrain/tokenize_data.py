"""Turn raw web-text shards into nanoGPT-format token files.

    python -m x1_pretrain.tokenize_data --input-dir DIR --output-dir DIR \\
        --tokenizer gpt2 --val-fraction 0.001 --workers 16

    python -m x1_pretrain.tokenize_data --input-dir DIR --output-dir DIR --tokenizer my/tokenizer.json
    python -m x1_pretrain.tokenize_data --input-dir DIR --output-dir DIR --train-tokenizer --vocab-size 32768

Output (in --output-dir): ``train.bin`` and ``val.bin`` (flat little-endian, no header, each document
followed by one end-of-text id: uint16 ids up to a vocab of 65,535, uint32 above), ``unigram_counts.npy``
(int64 count of every token id in the train split), ``tokenizer.json`` (the tokenizer, as a Hugging Face
tokenizers file) and ``meta.json``, written last: a directory without ``meta.json`` is not a finished output.

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
from .core.errors import DataError
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .data.pipeline import TokenizeJob, run, summary
from .data.tokenizer import EOT_TEXT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.tokenize_data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument("--input-dir", required=True, help="directory searched recursively for shards")
    p.add_argument("--output-dir", required=True, help="where train.bin, val.bin and meta.json go")
    p.add_argument(
        "--tokenizer",
        default="gpt2",
        help="gpt2 (GPT-2's BPE, 50,257 ids; the default) or the path of any Hugging Face tokenizer.json",
    )
    p.add_argument("--tokenizer-file", default=None, help="path to gpt2.tiktoken (else env/cache, see docs)")
    p.add_argument(
        "--train-tokenizer",
        action="store_true",
        help="first train a byte-level BPE of --vocab-size ids on the input shards (deterministic), then use it",
    )
    p.add_argument("--vocab-size", type=int, default=None, help="ids of the BPE --train-tokenizer trains")
    p.add_argument(
        "--eot-token",
        default=EOT_TEXT,
        help=f"the token that ends each document (default {EOT_TEXT}; must be in a --tokenizer file)",
    )
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


def check_tokenizer_flags(args: argparse.Namespace) -> None:
    """The tokenizer flags go together in three ways: gpt2 (+ --tokenizer-file), a tokenizer.json, or trained."""
    if args.train_tokenizer:
        if args.vocab_size is None:
            raise DataError("--train-tokenizer needs --vocab-size N (for example 32768)")
        if args.tokenizer != "gpt2" or args.tokenizer_file:
            raise DataError("--train-tokenizer trains its own BPE: drop --tokenizer / --tokenizer-file")
    elif args.vocab_size is not None:
        raise DataError(
            "--vocab-size is the size of a tokenizer to train: add --train-tokenizer, or drop it (a --tokenizer "
            "file has its own)"
        )
    if args.tokenizer != "gpt2" and args.tokenizer_file:
        raise DataError(f"--tokenizer-file is GPT-2's ranks file; --tokenizer {args.tokenizer} is a tokenizer.json")
    if args.eot_token != EOT_TEXT and args.tokenizer == "gpt2" and not args.train_tokenizer:
        raise DataError(f"GPT-2's end-of-text token is {EOT_TEXT}; --eot-token is for a --tokenizer file")
    if args.tokenizer != "gpt2" and not Path(args.tokenizer).is_file():
        raise DataError(
            f"--tokenizer {args.tokenizer}: no such file; give gpt2 or the path of a tokenizer.json "
            "(or --train-tokenizer --vocab-size N to train one on the input)"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    job = TokenizeJob(
        Path(args.input_dir),
        Path(args.output_dir),
        tokenizer_file=args.tokenizer_file,
        tokenizer=args.tokenizer,
        train_vocab=args.vocab_size if args.train_tokenizer else None,
        eot_token=args.eot_token,
        val_fraction=args.val_fraction,
        workers=args.workers,
        text_column=args.text_column,
        skip_bad_files=args.skip_bad_files,
        overwrite=args.overwrite,
        log_every_s=args.log_every_s,
    )

    def log(msg: str) -> None:
        print(f"[tokenize] {msg}", file=sys.stderr, flush=True)

    def body() -> int:
        check_tokenizer_flags(args)
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
