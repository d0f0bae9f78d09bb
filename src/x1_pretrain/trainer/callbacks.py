"""The loop's callbacks (see :class:`~x1_pretrain.trainer.loop.Callback` for the phases): one concern each.

``loop_callbacks()`` are the lab's own: the first step's timing, the eval cadence and its log line, the
throughput floor, the checkpoint cadence and the clean-stop timing. The builder adds the watchdog's progress
file (here), the spike watch (``spike.py``) and the budget guard (``budget_control.py``), in that order.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from ..core import names as N
from ..core.contract import EXIT_INTERRUPTED, EXIT_SLOW, EXIT_USAGE, PROGRESS, Progress, write_progress
from .loop import Callback, LoopState, Outcome, Run, StepReport, Verdict, evaluate_and_tell, save_and_tell


def loop_callbacks() -> list[Callback]:
    """The lab's own concerns, in the order they act after a step."""
    return [FirstStepTiming(), EvalCadence(), ValLog(), ThroughputFloor(), CheckpointCadence(), StopTiming()]


class FirstStepTiming(Callback):
    """This process's first step (compilation and warm-up included): worth knowing on a paid GPU."""

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        if report.meter.seen == 1:
            run.console(f"first step of this process took {report.dt:.1f} s (compilation and warm-up included)")
            run.record_metric(report.step, N.TRAIN_FIRST_STEP_S, report.dt)
        return None


class EvalCadence(Callback):
    """The val loss every ``train.eval_every`` steps (the loop measures it once more at the end)."""

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        if report.step % run.cfg.train.eval_every == 0 and report.step != run.end_step:
            evaluate_and_tell(run, state)
        return None


class ValLog(Callback):
    """The val loss to MLflow and the console."""

    def after_eval(self, run: Run, state: LoopState, val_loss: float) -> None:
        run.record_metric(state.step, N.VAL_LOSS, val_loss)
        bpb = state.last_val_bpb
        line = f"step {state.step:>7} | val loss {val_loss:.4f}"
        if not math.isnan(bpb):  # NaN: the run has no byte table for the data's tokenizer
            run.record_metric(state.step, N.VAL_BPB, bpb)
            line += f" | {bpb:.4f} bits/byte"
        run.console(line)


class CheckpointCadence(Callback):
    """A checkpoint every ``checkpoint.every_steps`` steps or ``checkpoint.every_min`` minutes (the checkpointer
    says when one is due), or when SIGUSR1 asked for one; never at the last step (the final one is written
    there)."""

    def at_boundary(self, run: Run, state: LoopState, report: StepReport) -> None:
        if run.checkpointer is None:
            return
        c = run.cfg.checkpoint
        periodic = run.checkpointer.due(report.step, c.every_steps, c.every_min) if report.step < run.end_step else None
        if periodic:
            save_and_tell(run, state, periodic)
        elif report.checkpoint_now:
            save_and_tell(run, state, "requested (SIGUSR1)")


class StopTiming(Callback):
    """How long a stop by signal took, from the signal to the checkpoint written (the budget of
    ``--stop-grace-s``)."""

    def on_stop(self, run: Run, state: LoopState, outcome: Outcome) -> None:
        if outcome.exit_code == EXIT_INTERRUPTED and run.stop.requested_at is not None:
            why = run.stop.requested or "a signal to another rank"
            run.console(f"clean stop {run.clock() - run.stop.requested_at:.2f} s after {why}")


class MirrorRefused(Callback):
    """``--ckpt-remote`` found to belong to another run after the launch (the store could not be reached then):
    the mirror writes nothing there, and the run stops at the next step boundary with a checkpoint kept
    locally, exit 2 with the launch refusal's text (``run_owner.refusal``). Rank 0's verdict: it holds the
    mirror."""

    def __init__(self, mirror: Any) -> None:
        self.mirror = mirror

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        why = getattr(self.mirror, "refusal", None)
        if not run.world.main or not why:
            return None
        run.console(f"error: {why}")
        return Outcome(EXIT_USAGE, f"stopped: {why}", report.step), True


class ThroughputFloor(Callback):
    """``--min-tokens-per-s``, as the lab means it: during the run's first ``min_tokens_per_s_window_min``
    minutes of training (summed over restarts) a warm window below the floor ends the run (exit 6, to
    diagnose); later a drop is logged and alerted once per episode and training goes on, unless
    ``min_tokens_per_s_always``."""

    def __init__(self) -> None:
        self.below = False  # inside a reported episode (after the window)

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        cfg, meter = run.cfg.train, report.meter
        tps = report.metrics.get(N.TRAIN_TOKENS_PER_S)
        if cfg.min_tokens_per_s is None or tps is None or not meter.warm or not run.world.main:
            return None
        if tps >= cfg.min_tokens_per_s:
            if self.below:
                run.console(f"throughput back above --min-tokens-per-s: {tps:,.0f} tokens/s")
            self.below = False
            return None
        what = (
            f"throughput {tps:,.0f} tokens/s over the last {len(meter.times)} steps is below "
            f"--min-tokens-per-s {cfg.min_tokens_per_s:,.0f}"
        )
        in_window = state.train_time_s <= cfg.min_tokens_per_s_window_min * 60
        if in_window or cfg.min_tokens_per_s_always:
            run.console(f"warning: {what}: stopping to diagnose (exit 6)")
            return Outcome(EXIT_SLOW, "throughput below floor", state.step), True
        if not self.below:
            self.below = True
            run.console(
                f"warning: {what} at step {state.step}, after the first "
                f"{cfg.min_tokens_per_s_window_min:g} min: training goes on (diagnose it: another process "
                "on the GPU, thermal throttling, a slow disk; --min-tokens-per-s-always stops instead)"
            )
            if run.alert is not None:
                run.alert(
                    f"x1 throughput dropped to {tps:,.0f} tokens/s at step {state.step}", f"{what}. The run continues."
                )
        return None


class ProgressFile(Callback):
    """Keeps ``progress.json`` in the checkpoint dir current for the watchdog: at the first step, every
    ``train.log_every`` steps and after each checkpoint. A write that fails (a full disk) is skipped, with one
    warning per episode of failures and one line when it is written again: the file is the watchdog's view of
    the run, never a reason to stop it."""

    def __init__(self, ckpt_dir: Path, started: float, checkpointer: Any) -> None:
        self.dir, self.started, self.ckpt = ckpt_dir, started, checkpointer
        self.first_step_started: float | None = None
        self.first_step_s: float | None = None
        self.failing = 0  # writes skipped since the last one that succeeded

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        first = self.first_step_started is None
        if first:
            self.first_step_started = time.time() - state.last_step_s
            self.first_step_s = state.last_step_s
        if first or state.step % run.cfg.train.log_every == 0:
            self._write(run, state)
        return None

    def after_checkpoint(self, run: Run, state: LoopState, reason: str) -> None:
        self._write(run, state)

    def _write(self, run: Run, state: LoopState) -> None:
        try:
            write_progress(
                self.dir,
                Progress(
                    pid=os.getpid(),
                    step=state.step,
                    time_unix=time.time(),
                    started_unix=self.started,
                    first_step_started_unix=self.first_step_started,
                    first_step_s=self.first_step_s,
                    last_checkpoint_step=self.ckpt.last_saved_step,
                    total_steps=run.cfg.train.total_steps,
                ),
            )
        except OSError as e:
            if not self.failing:
                run.console(
                    f"warning: {self.dir / PROGRESS} could not be written at step {state.step} "
                    f"({e.strerror or e}); training goes on and skips it until it can be written"
                )
            self.failing += 1
            return
        if self.failing:
            run.console(
                f"{self.dir / PROGRESS} is written again at step {state.step} ({self.failing} write(s) skipped)"
            )
            self.failing = 0
