"""Export a checkpoint as a Hugging Face Llama folder:

    python -m x1_pretrain.export_hf --checkpoint /workspace/checkpoints --output hf/x1-50m

``--checkpoint`` is a step dir, a checkpoint dir (its newest complete step, else final.safetensors) or a
.safetensors file (the config then comes from a sibling step dir, or ``--config``). The output folder
holds ``config.json`` (a LlamaConfig, float32), ``generation_config.json``, ``model.safetensors`` (fp32,
tied LM head not duplicated), GPT-2's tokenizer files rebuilt from the local ``gpt2.tiktoken``
(``vocab.json``, ``merges.txt``, ``tokenizer_config.json``, ``special_tokens_map.json``) and
``x1_export.json`` (where it came from). ``AutoModelForCausalLM.from_pretrained(DIR)`` gives x1's logits
and ``AutoTokenizer.from_pretrained(DIR)`` tiktoken's ids. The folder is built under a temporary name and
renamed into place. If the tokenizer file cannot be found the model is exported without tokenizer files
and the command says so (exit 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core.cli import guarded
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .report.ckpt_source import resolve
from .report.hf_export import export, transformers_hint


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.export_hf",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument(
        "--checkpoint", required=True, type=Path, help="step_NNNNNNN/ dir, checkpoint dir, or .safetensors file"
    )
    p.add_argument("--output", required=True, type=Path, help="folder to write (must not exist unless --overwrite)")
    p.add_argument(
        "--config", type=Path, help="YAML config, when the checkpoint carries none (e.g. a lone final.safetensors)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a key of --config (repeatable)",
    )
    p.add_argument("--tokenizer-file", help="gpt2.tiktoken to build the tokenizer files from (default: the cache)")
    p.add_argument("--no-tokenizer", action="store_true", help="export the model only")
    p.add_argument(
        "--overwrite", action="store_true", help="replace --output if it exists (after the new one is complete)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    def log(msg: str) -> None:
        print(f"[export_hf] {msg}", file=sys.stderr, flush=True)

    def body() -> int:
        src = resolve(args.checkpoint, args.config, args.set, warn=lambda m: log(f"warning: {m}"))
        log(f"exporting {src.describe()}")
        record = export(src, args.output, args.tokenizer_file, not args.no_tokenizer, args.overwrite, log)
        print(
            f"[export_hf] wrote {args.output}: {record['parameters']:,} parameters (fp32), tokenizer "
            f"{'MISSING' if record['tokenizer'].startswith('not written') else 'included'}; load it with "
            f"transformers.AutoModelForCausalLM.from_pretrained({str(args.output)!r})"
        )
        import torch

        hint = transformers_hint(torch.__version__)
        if hint:
            log(hint)
        return 0

    return guarded(body)


if __name__ == "__main__":
    raise SystemExit(main())
