"""One trainer process from options to exit code: config → device → launch gate → signals → build → loop.

Exit codes: 0 finished · 2 bad usage/config/data · 3 budget stop with checkpoint · 4 budget stop without
checkpoint · 5 diverged · 6 throughput below the floor · 75 interrupted after a clean checkpoint · 130 a
second SIGINT · 1 anything unexpected.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..budget import alerts
from ..budget import gate as bg
from ..budget.guard import Limits, read_source
from ..budget.monitor import BudgetMonitor, Effects
from ..core import config as C
from ..core.errors import EXIT_ABORTED, EXIT_BUDGET_CHECKPOINT, EXIT_DIVERGED, EXIT_UNEXPECTED, X1Error
from ..model import flops
from . import checkpoint as ck
from . import distributed
from .build import Built, Context, build_run, start_batches, tag_final
from .device import resolve_device
from .hooks import outcome_of
from .loop import Diverged, StopFlag, train_loop
from .options import BudgetOptions, TrainOptions
from .signals import install_signal_handlers

Log = Callable[[str], None]


def console(msg: str) -> None:
    print(f"[x1] {msg}", flush=True)


def _quiet(msg: str) -> None:
    return None


def budget_limits(b: BudgetOptions) -> Limits | None:
    """The guard's limits from the flags, or None when no cap is set. Bad combinations are usage errors."""
    if b.cap_usd is None:
        if b.dry_run:
            raise X1Error("--dry-run-budget needs --budget-cap-usd and --budget-curr-cost-uri")
        return None
    problems = []
    if b.cap_usd <= 0:
        problems.append(f"--budget-cap-usd {b.cap_usd} must be positive")
    if not 0 <= b.alert_usd < b.cap_usd:
        problems.append(f"--budget-alert-usd {b.alert_usd} must be below --budget-cap-usd {b.cap_usd}")
    if not b.source:
        problems.append("--budget-cap-usd needs --budget-curr-cost-uri (the budget.json the sidecar writes: "
                        "python -m x1_pretrain.budget_sidecar --out budget.json ...)")
    for flag, value in (("--budget-check-every-min", b.check_every_min),
                        ("--budget-sidecar-interval-min", b.sidecar_interval_min),
                        ("--budget-unknown-grace-min", b.unknown_grace_min)):
        if value <= 0:
            problems.append(f"{flag} must be positive")
    if problems:
        raise X1Error("; ".join(problems))
    return Limits(b.cap_usd, b.alert_usd, b.sidecar_interval_min, 3.0, b.unknown_grace_min)


@dataclass
class BudgetSetup:
    """The budget guard of this run (rank 0): limits, alert channels, and the monitor it builds."""

    opts: BudgetOptions
    limits: Limits
    alerter: Any

    def tags(self) -> dict[str, Any]:
        tags: dict[str, Any] = {"budget_cap_usd": self.limits.cap_usd, "budget_alert_usd": self.limits.alert_usd,
                                "budget_source": self.opts.source}
        if self.opts.force_launch:
            tags["force_launch"] = "true"
        return tags

    def monitor(self, log: Log, metrics: Any) -> BudgetMonitor:
        return BudgetMonitor(str(self.opts.source), self.limits, self.opts.check_every_min * 60,
                             Effects(send_alert=self.alerter.send, log=log, metrics=metrics))


def _launch_gate(opts: TrainOptions, cfg: C.Config, limits: Limits, peak: float | None, log: Log) -> int | None:
    """The dry run, or the gate before anything is built: an exit code to stop with, or None to go on."""
    b = opts.budget
    latest = ck.read_latest(opts.ckpt_dir) if opts.resume else None
    done = int(latest.split("_")[1]) if latest and latest.startswith("step_") else 0
    step_s = bg.expected_step_s(b.expected_step_s, cfg.tokens_per_step(), flops.flops_per_token(cfg.model).honest,
                                peak, b.assumed_mfu)
    plan = bg.Plan(cfg.train.total_steps, done, step_s)
    alerter = alerts.from_env()
    if b.dry_run:
        return bg.dry_run(str(b.source), limits, plan, b.max_rate_usd_per_hr, alerter, log)
    problems = bg.gate_problems(read_source(str(b.source)), plan, limits, b.max_rate_usd_per_hr)
    if problems and not b.force_launch:
        for problem in problems:
            print(f"error: launch refused: {problem}", file=sys.stderr)
        return EXIT_BUDGET_CHECKPOINT
    for problem in problems:
        log(f"warning: --force-launch given despite: {problem}")
    if step_s is None:
        log("warning: the planned cost cannot be checked (no --expected-step-s and no known GPU peak)")
    return None


def train(opts: TrainOptions) -> int:
    """Train under ``opts``; returns the exit code (X1Error and KeyboardInterrupt propagate)."""
    from ..core.env import device_name, keep_freed_memory

    started_unix = time.time()
    world = distributed.world_from_env()
    cfg = C.load(opts.config, opts.overrides, list(opts.sets), world_size=world.size)
    log: Log = console if world.main else _quiet  # ranks other than 0 train quietly; errors still reach stderr
    if world.size > 1:
        log(f"data parallel over {world.size} ranks: global batch {cfg.train.batch_size} = micro-batch "
            f"{cfg.train.micro_batch_size} x grad accumulation {cfg.train.grad_accum_steps} x {world.size} ranks")
    import numpy as np  # noqa: F401  (imported before torch on purpose: fail fast on a broken env)

    limits = budget_limits(opts.budget)
    sp = opts.spike
    if sp.inject_at_step is not None and (sp.inject_at_step < 1 or sp.batches < 1):
        raise X1Error(f"--inject-spike-at-step {sp.inject_at_step} and --spike-batches {sp.batches} "
                      "must be at least 1")
    device = resolve_device(cfg.train.device, world.local_rank, world.size)
    if device.type == "cpu":
        keep_freed_memory()  # large CPU tensors would otherwise be page-faulted in again at every step
    peak = flops.peak_tflops(device_name(device) if device.type == "cuda" else None, opts.peak_tflops)
    budget = None
    if limits is not None:
        stop_code = _launch_gate(opts, cfg, limits, peak, log)
        if stop_code is not None:
            return stop_code
        if world.main:
            budget = BudgetSetup(opts.budget, limits, alerts.from_env())
    stop = StopFlag()
    restore_signals = install_signal_handlers(stop)
    distributed.init(world, device.type)
    try:
        ctx = Context(cfg, opts, world, device, log, stop, started_unix, budget)
        code = run_training(ctx, cap_set=limits is not None)
        if world.size > 1:
            # Ranks leave together once rank 0 has written its last checkpoint and its exit status: a rank
            # that left early with a non-zero code would make torchrun signal rank 0 mid-write.
            import torch

            if world.main:
                ck.write_exit_status(opts.ckpt_dir, code, "see the log")
            torch.distributed.barrier()
        return code
    finally:
        restore_signals()
        distributed.shutdown(world)


def _first_check(ctx: Context, built: Built, cap_set: bool) -> int:
    """The budget check before the first step; every rank learns rank 0's verdict, or the others would wait
    for it forever."""
    code = 0
    if built.monitor is not None:
        first = outcome_of(built.monitor.check(built.state.step, ctx.cfg.train.total_steps, 0.0), built.state.step)
        if first is not None:
            code = first[0].exit_code
            ctx.log(f"{first[0].reason} (before training; exit {code})")
    if cap_set:
        (code,) = distributed.agree_max([code], ctx.world, ctx.device)
    return code


def run_training(ctx: Context, cap_set: bool) -> int:
    built = build_run(ctx)
    first_code = _first_check(ctx, built, cap_set)
    if first_code:  # stop before training: nothing new to checkpoint
        status = "KILLED"
        found = built.resume.found
        if first_code == EXIT_BUDGET_CHECKPOINT and found is not None and ctx.world.main:
            # the run ends at its last checkpoint
            tag_final(built.tracker, ctx.ckpt_dir, found.path, ck.write_final_files(ctx.ckpt_dir, found.path))
            status = "FINISHED"
        built.tracker.close(status, spill_dir=ctx.ckpt_dir)
        return first_code
    start_batches(built)
    status = "FAILED"
    try:
        outcome = train_loop(built.run, built.state)
        # A budget stop with a checkpoint is a planned end of the run (and what export_run exports).
        status = "FINISHED" if outcome.exit_code in (0, EXIT_BUDGET_CHECKPOINT) else "KILLED"
        built.tracker.set_tags({"end_reason": outcome.reason[:4000], "exit_code": outcome.exit_code})
        ctx.log(f"{outcome.reason} at step {outcome.step}: exit {outcome.exit_code}")
        return outcome.exit_code
    except Diverged as e:
        built.tracker.set_tags({"diverged_at_step": e.step})
        print(f"error: {e}. No checkpoint was written from these weights. Check the data for out-of-range ids "
              "and that fp32 master weights are on (train.precision bf16 keeps them); lower optim.lr if it "
              "persists.", file=sys.stderr)
        return EXIT_DIVERGED
    except (X1Error, KeyboardInterrupt):
        raise
    except Exception:
        traceback.print_exc()
        return EXIT_UNEXPECTED
    finally:
        if built.prefetch is not None:
            built.prefetch.close()
        try:
            if built.checkpointer is not None:
                built.checkpointer.wait()
        finally:
            built.tracker.close(status, spill_dir=ctx.ckpt_dir)


def main_guarded(opts: TrainOptions) -> tuple[int, str]:
    """(exit code, one-line reason) for ``opts``: user mistakes and a second Ctrl-C become codes too."""
    try:
        return train(opts), "see the log"
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code, str(e).splitlines()[0]
    except KeyboardInterrupt:
        print("aborted by a second SIGINT: no checkpoint written for the current step", file=sys.stderr)
        return EXIT_ABORTED, "aborted by a second SIGINT"
