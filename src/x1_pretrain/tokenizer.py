"""The exact GPT-2 BPE, built by tiktoken from a local, hash-checked ``gpt2.tiktoken`` file.

Nothing is downloaded at run time unless every local source is missing. Lookup order:

1. an explicit path (``--tokenizer-file``),
2. the environment variable ``X1_TOKENIZER_FILE``,
3. the project's cache, ``$X1_CACHE_DIR`` or ``~/.cache/x1_pretrain`` (``make`` fills it; see
   ``python -m x1_pretrain.tokenizer fetch``),
4. tiktoken's own ``get_encoding("gpt2")`` (its cache or the network).

``python -m x1_pretrain.tokenizer fetch`` fills the cache from PyPI's ``openai-whisper`` sdist, which
ships the same file; only that one file is extracted, and only if its sha256 matches.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .core.cli import guarded
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .data.tokenizer import fetch_into_cache, load_gpt2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.tokenizer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="fill the cache with gpt2.tiktoken (hash-checked)")
    f.add_argument("--dest", type=Path, default=None, help="where to write it (default: the cache)")
    s = sub.add_parser("show", help="say which gpt2.tiktoken would be used, and encode a sample")
    s.add_argument("--tokenizer-file", default=None)
    s.add_argument("text", nargs="?", default="Hello world")
    args = p.parse_args(argv)
    setup_logging(args.log_level)

    def body() -> int:
        if args.cmd == "fetch":
            path = fetch_into_cache(args.dest)
            print(f"[tokenizer] gpt2.tiktoken ready at {path} (sha256 verified)")
        else:
            tok = load_gpt2(args.tokenizer_file, allow_download=False)
            print(f"[tokenizer] source: {tok.source}")
            print(f"[tokenizer] {args.text!r} -> {tok.encode(args.text)}")
        return 0

    return guarded(body, os_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
