"""Print what a checkpoint writes after a prompt, for a quick look at what the model learned:

    python -m x1_pretrain.sample --checkpoint /workspace/checkpoints --prompt "The capital of France is"

``--checkpoint`` takes the same forms as ``export_hf`` (step dir, checkpoint dir, .safetensors file with
``--config``). Sampling is temperature + top-k (``--temperature 0`` or ``--greedy``: argmax) from a seeded
generator, so the same seed, checkpoint and device print the same text. The context is cropped to the
model's ``seq_len``; generation stops at ``<|endoftext|>`` unless ``--ignore-eot``. The prompt and its
continuation go to stdout, one sample after another separated by a ``---`` line; notes go to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core.cli import guarded
from .core.errors import X1Error
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .model.generate import Sampling, generate, pick_device


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.sample", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(p)
    p.add_argument(
        "--checkpoint", required=True, type=Path, help="step_NNNNNNN/ dir, checkpoint dir, or .safetensors file"
    )
    p.add_argument("--prompt", default="", help="text to continue (empty: start a new document)")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 means greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=200, help="sample among the k likeliest tokens; 0 = all")
    p.add_argument("--greedy", action="store_true", help="same as --temperature 0")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--ignore-eot", action="store_true", help="keep going after <|endoftext|>")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--config", type=Path, help="YAML config, when the checkpoint carries none")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--tokenizer-file", help="gpt2.tiktoken (default: the cache)")
    return p


def _check(args: argparse.Namespace) -> None:
    problems = []
    if args.max_new_tokens < 1:
        problems.append(f"--max-new-tokens {args.max_new_tokens}: must be at least 1")
    if args.temperature < 0:
        problems.append(f"--temperature {args.temperature}: must be >= 0 (0 is greedy)")
    if args.top_k < 0:
        problems.append(f"--top-k {args.top_k}: must be >= 0 (0 keeps every token)")
    if args.num_samples < 1:
        problems.append(f"--num-samples {args.num_samples}: must be at least 1")
    if problems:
        raise X1Error("; ".join(problems))


def run(args: argparse.Namespace) -> int:
    import torch

    from .report.ckpt_source import load_model, resolve
    from .report.model_card import load_tokenizer

    _check(args)
    src = resolve(args.checkpoint, args.config, args.set)
    tok = load_tokenizer(src, args.tokenizer_file)  # the run's own, or GPT-2's
    device = pick_device(args.device)
    model = load_model(src, device)
    ids = tok.encode(args.prompt) if args.prompt else [tok.eot_id]
    too_big = [i for i in ids if i >= src.model.vocab_size]
    if too_big:
        raise X1Error(
            f"--prompt: token id {too_big[0]} is outside this model's vocabulary "
            f"(model.vocab_size {src.model.vocab_size}); use a prompt the model can read"
        )
    temperature = 0.0 if args.greedy else args.temperature
    print(
        f"[sample] {src.describe()} on {device}; "
        + (
            "greedy"
            if temperature == 0
            else f"temperature {temperature}, top-k {args.top_k or 'all'}, seed {args.seed}"
        ),
        file=sys.stderr,
        flush=True,
    )
    generator = torch.Generator(device=device)
    generator.manual_seed(args.seed)
    for n in range(args.num_samples):
        how = Sampling(
            args.max_new_tokens,
            temperature,
            args.top_k or None,
            None if args.ignore_eot else tok.eot_id,
            allowed_vocab=tok.vocab_size,
        )
        new = generate(model, ids, how, generator)
        if n:
            print("---")
        print(args.prompt + tok.decode(new), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return guarded(lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())
