"""Will the run fit? Time, tokens and dollars for a config on a GPU, before any money is spent.

    python -m x1_pretrain.plan --config configs/x1-50m-a100.yaml --gpu a100-80gb --rate-usd-per-hr 1.10 \\
        [--hours 24 | --total-steps N] [--budget-assumed-mfu 0.40 | --tokens-per-s MEASURED]

The cap, the time window, the buffer, the reserve and the assumed MFU are the config's ``budget:`` section
(configs/x1-50m-a100.yaml holds the lab's), each overridden by the trainer's flag of the same name.
Throughput comes from the honest FLOPs per token (6N + tied LM head + attention; docs/errata.md, 1) at an
assumed MFU (default 0.40; the lab assumes 0.48), or a measured tokens/s (bench/gpu_check.sh). Cost: compute
(set-up + training hours x rate), a reserve for the final checkpoint, export and shutdown, storage egress
$1, persistent disk $2, a $5 buffer for one restart, against the $35 cap. The predicted loss is Hoffmann
et al. (2022)'s fit, shown with its constants and the caveat that it was fitted on another tokenizer and corpus.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .budget.money import Lines, steps_that_fit
from .budget.plan_text import render
from .budget.planner import GPUS, Ask, Plan, make_plan
from .core import config as C
from .core.cli import guarded
from .core.errors import X1Error
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .launch.options import add_budget_flags, add_eval_task_flags, budget_overrides, eval_cost, eval_task_overrides
from .trainer.schedule import planned


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(p)
    p.add_argument("--config", required=True, type=Path, help="the run's YAML config")
    p.add_argument("--gpu", help=f"one of {', '.join(GPUS)}")
    p.add_argument("--rate-usd-per-hr", required=True, type=float, help="the instance's price per hour")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--hours", type=float, help="plan this many hours of training")
    size.add_argument("--total-steps", type=int, help="plan this many optimizer steps (default: the config's)")
    p.add_argument("--tokens-per-s", type=float, help="a measured throughput instead of an assumed MFU")
    p.add_argument("--num-gpus", type=int, default=1, help="GPUs in the instance (the rate is for all of them)")
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="machines of a multi-node job, each with --num-gpus GPUs at "
        "--rate-usd-per-hr and its own --disk-usd: GPUs, rate and disk times N (default 1)",
    )
    p.add_argument("--peak-tflops", type=float, help="bf16 peak per GPU, for a GPU not in the table")
    p.add_argument("--setup-hours", type=float, default=0.0, help="billed hours outside training (default 0)")
    p.add_argument("--egress-usd", type=float, default=1.0, help="storage egress line (default $1; the sidecar's)")
    p.add_argument("--disk-usd", type=float, default=2.0, help="persistent disk line (default $2; the sidecar's)")
    add_budget_flags(
        p.add_argument_group("the budget (the config's budget section; the trainer's flags)"),
        ("cap_usd", "max_hours", "assumed_mfu", "buffer_usd", "reserve_min", "fit"),
        OLD,
    )
    add_eval_task_flags(
        p.add_argument_group(
            "task evaluations during training, priced in the plan (the config's "
            "train.eval_tasks keys; the trainer's flags)"
        )
    )
    return p


OLD = {
    "assumed_mfu": "--mfu",
    "buffer_usd": "--buffer-usd",
    "reserve_min": "--reserve-min",
    "max_hours": "--max-hours",
    "fit": "--fit-to-budget",
}  # plan's spellings before it used the trainer's, kept for one release


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    def body() -> int:
        if args.tokens_per_s is not None and args.budget_assumed_mfu is not None:
            raise X1Error("--tokens-per-s and --budget-assumed-mfu are two answers to one question: give one")
        overrides = budget_overrides(args)
        fit = bool(overrides.pop("budget.fit", False))  # shown for a cosine config too, with what to change
        cfg = C.load(args.config, {**overrides, **eval_task_overrides(args)})
        b = cfg.budget
        if b.cap_usd is None:
            raise X1Error(f"{args.config} has no budget.cap_usd: pass --budget-cap-usd (the lab's: 35)")
        if b.max_hours is None:
            raise X1Error(f"{args.config} has no budget.max_hours: pass --budget-max-hours (the lab's: 24)")
        if args.nodes < 1:
            raise X1Error(f"--nodes must be at least 1, got {args.nodes}")
        ask = Ask(
            hours=args.hours,
            steps=args.total_steps,
            mfu=b.assumed_mfu,
            tokens_per_s=args.tokens_per_s,
            n_gpus=args.num_gpus * args.nodes,
            cap_usd=b.cap_usd,
            max_hours=b.max_hours,
            setup_hours=args.setup_hours,
            peak_tflops=args.peak_tflops,
            lines=Lines(egress_usd=args.egress_usd, disk_usd=args.disk_usd * args.nodes, buffer_usd=b.buffer_usd),
            reserve_min=b.reserve_min,
            evals=eval_cost(cfg),
        )
        if args.nodes > 1:
            print(
                f"{args.nodes} nodes x {args.num_gpus} GPU(s): ${args.rate_usd_per_hr * args.nodes:.2f}/h and "
                f"${args.disk_usd * args.nodes:.2f} of disk for all of them (run budget_sidecar --nodes "
                f"{args.nodes} on the head node); the assumed MFU includes the gradient all-reduce between nodes"
            )
        plan = make_plan(cfg, args.gpu, args.rate_usd_per_hr * args.nodes, ask)
        source = (
            "--total-steps"
            if args.total_steps
            else f"{args.hours:g} h"
            if args.hours
            else "train.total_steps in the config"
        )
        print(render(plan, str(args.config), source))
        if fit or b.fit:
            print("\n" + fitted_text(plan))
        return 0

    return guarded(body)


def fitted_text(plan: Plan) -> str:
    """What --budget-fit would make of these inputs: the end the money reaches and where the decay starts."""
    optim = plan.config.optim
    if optim.schedule != "wsd":
        optim = dataclasses.replace(optim, schedule="wsd")
    # like the trainer: no buffer kept aside (a restart's cost is re-fitted when it happens), the window kept
    end = min(plan.steps, steps_that_fit(plan.money, plan.step_s, plan.max_hours, buffer=False))
    if end <= 0:
        return "fitted to the budget: nothing fits (the fixed lines and the reserve exceed the cap)"
    h = planned(end, optim)
    hours = end / plan.steps_per_hour
    note = (
        ""
        if plan.config.optim.schedule == "wsd"
        else f" (the config's schedule is {plan.config.optim.schedule!r}: train with --set optim.schedule=wsd)"
    )
    how = f"--budget-fit, wsd, decay {optim.decay_fraction:.0%} {optim.decay_shape}"
    return (
        f"fitted to the budget ({how}){note}:\n"
        f"  expected end: step {end:,} of at most {plan.steps:,} ({end * plan.tokens_per_step / 1e9:,.2f}B "
        f"tokens, {hours:,.1f} h, ${plan.total_usd(hours, buffer=False):,.2f} in all, no buffer kept: a "
        "restart's cost is re-fitted when it happens)\n"
        f"  decay: from step {h.decay_start:,} to min_lr {optim.min_lr:g} at step {end:,}\n"
        "  the end follows the money at every budget check (the price, the measured speed, restarts)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
