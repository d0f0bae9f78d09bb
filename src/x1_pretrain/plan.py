"""Will the run fit? Time, tokens and dollars for a config on a GPU, before any money is spent.

    python -m x1_pretrain.plan --config configs/x1-50m-a100.yaml --gpu a100-80gb --rate-usd-per-hr 1.10 \\
        [--hours 24 | --total-steps N] [--mfu 0.40 | --tokens-per-s MEASURED] [--reserve-min 10]

Throughput comes from the honest FLOPs per token (6N + tied LM head + attention; see ERRATA 1) at an
assumed MFU (default 0.40; the lab assumes 0.48), or a measured tokens/s (bench/gpu_check.sh). Cost: compute
(set-up + training hours x rate), a reserve for the final checkpoint, export and shutdown, storage egress
$1, persistent disk $2, a $5 buffer for one restart, against the $35 cap. The predicted loss is Hoffmann
et al. (2022)'s fit, shown with its constants and the caveat that it was fitted on another tokenizer and corpus.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .budget.money import DEFAULT_MFU, DEFAULT_RESERVE_MIN, Lines, steps_that_fit
from .budget.plan_text import render
from .budget.planner import GPUS, Ask, Plan, make_plan
from .core import config as C
from .core.cli import guarded
from .training.schedule import planned


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m x1_pretrain.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="the run's YAML config")
    p.add_argument("--gpu", help=f"one of {', '.join(GPUS)}")
    p.add_argument("--rate-usd-per-hr", required=True, type=float, help="the instance's price per hour")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--hours", type=float, help="plan this many hours of training")
    size.add_argument("--total-steps", type=int, help="plan this many optimizer steps (default: the config's)")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                       help=f"assumed MFU, honest accounting (default {DEFAULT_MFU}; the lab assumes 0.48)")
    speed.add_argument("--tokens-per-s", type=float, help="a measured throughput instead of an assumed MFU")
    p.add_argument("--num-gpus", type=int, default=1, help="GPUs in the instance (the rate is for all of them)")
    p.add_argument("--peak-tflops", type=float, help="bf16 peak per GPU, for a GPU not in the table")
    p.add_argument("--budget-cap-usd", type=float, default=35.0, help="the hard cap (default: the lab's 35)")
    p.add_argument("--max-hours", type=float, default=24.0, help="the time window (default: the lab's 24 h)")
    p.add_argument("--setup-hours", type=float, default=0.0, help="billed hours outside training (default 0)")
    p.add_argument("--egress-usd", type=float, default=1.0, help="storage egress line (default $1)")
    p.add_argument("--disk-usd", type=float, default=2.0, help="persistent disk line (default $2)")
    p.add_argument("--buffer-usd", type=float, default=5.0, help="buffer for one restart (default $5)")
    p.add_argument("--fit-to-budget", action="store_true",
                   help="--total-steps is an upper bound: show the schedule fitted to the money (wsd)")
    p.add_argument("--reserve-min", type=float, default=DEFAULT_RESERVE_MIN,
                   help=f"final checkpoint, export and shutdown after the last step (default {DEFAULT_RESERVE_MIN:g})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        cfg = C.load(args.config)
        ask = Ask(hours=args.hours, steps=args.total_steps, mfu=args.mfu, tokens_per_s=args.tokens_per_s,
                  n_gpus=args.num_gpus, cap_usd=args.budget_cap_usd, max_hours=args.max_hours,
                  setup_hours=args.setup_hours, peak_tflops=args.peak_tflops,
                  lines=Lines(args.egress_usd, args.disk_usd, args.buffer_usd), reserve_min=args.reserve_min)
        plan = make_plan(cfg, args.gpu, args.rate_usd_per_hr, ask)
        source = ("--total-steps" if args.total_steps else f"{args.hours:g} h" if args.hours
                  else "train.total_steps in the config")
        print(render(plan, str(args.config), source))
        if args.fit_to_budget:
            print("\n" + fitted_text(plan))
        return 0

    return guarded(body)


def fitted_text(plan: Plan) -> str:
    """What --fit-to-budget would make of these inputs: the end the money reaches and where the decay starts."""
    optim = plan.config.optim
    if optim.schedule != "wsd":
        optim = dataclasses.replace(optim, schedule="wsd")
    # like the trainer: no buffer kept aside (a restart's cost is re-fitted when it happens), the window kept
    end = min(plan.steps, steps_that_fit(plan.money, plan.step_s, plan.max_hours, buffer=False))
    if end <= 0:
        return "fitted to the budget: nothing fits (the fixed lines and the reserve exceed the cap)"
    h = planned(end, optim)
    hours = end / plan.steps_per_hour
    note = "" if plan.config.optim.schedule == "wsd" else " (the config's schedule is " \
        f"{plan.config.optim.schedule!r}: train with --set optim.schedule=wsd)"
    how = f"--fit-to-budget, wsd, decay {optim.decay_fraction:.0%} {optim.decay_shape}"
    return (f"fitted to the budget ({how}){note}:\n"
            f"  expected end: step {end:,} of at most {plan.steps:,} ({end * plan.tokens_per_step / 1e9:,.2f}B "
            f"tokens, {hours:,.1f} h, ${plan.total_usd(hours, buffer=False):,.2f} in all, no buffer kept: a "
            "restart's cost is re-fitted when it happens)\n"
            f"  decay: from step {h.decay_start:,} to min_lr {optim.min_lr:g} at step {end:,}\n"
            "  the end follows the money at every budget check (the price, the measured speed, restarts)")


if __name__ == "__main__":
    raise SystemExit(main())
