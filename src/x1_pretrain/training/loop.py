"""The training loop, as a story: batch → forward → backward → clip → step → log, then at their
steps: eval, checkpoint, budget check, spike watch, interruption.

Everything with a side effect (clock, signals, files, MLflow, the budget file) is built by
``train.py`` and handed in through :class:`Run`, so tests can drive the loop with fakes.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from ..core import names as N
from ..core.config import Config
from ..core.errors import EXIT_BUDGET_CHECKPOINT, EXIT_INTERRUPTED, EXIT_OK, EXIT_SLOW
from ..data.tokens import Batch
from .device import eager_modules
from .distributed import World, agree_max, mean_over_ranks
from .schedule import Horizon, lr_at, planned, retarget


class Diverged(Exception):
    def __init__(self, step: int, loss: float, grad_norm: float) -> None:
        self.step, self.loss, self.grad_norm = step, loss, grad_norm
        super().__init__(f"loss {loss} / grad norm {grad_norm} at step {step}: training diverged")


@dataclass
class LoopState:
    """What a checkpoint must restore besides weights and optimizer: counts of completed work."""

    step: int = 0                 # optimizer steps completed (the next step to run has this index)
    tokens_seen: int = 0
    train_time_s: float = 0.0     # wall-clock spent in training steps, summed over restarts
    last_loss: float = float("nan")
    last_val_loss: float = float("nan")
    last_step_s: float = float("nan")  # duration of the latest step (not saved)
    last_eval_step: int = -1           # the step the val loss was last measured at (not saved)


@dataclass
class Outcome:
    exit_code: int
    reason: str
    step: int


class Tracker(Protocol):
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...


class StepHook(Protocol):
    """Something that looks at the run after each optimizer step and may end it.

    Returns None to carry on, or an Outcome; ``checkpoint`` asks the loop to write one first.
    """

    def after_step(self, run: Run, state: LoopState, metrics: dict[str, float]) -> tuple[Outcome, bool] | None: ...


class BatchSource(Protocol):
    """Replaces the data batch of some steps (spike injection); must be a pure function of the step."""

    def replace(self, step: int, chunk: int, batch: Batch) -> Batch: ...


class CheckpointSaver(Protocol):
    def save(self, run: Run, state: LoopState, reason: str, required: bool = False) -> None: ...

    def wait(self) -> None: ...

    def due(self, step: int, every_steps: int, every_min: float) -> str | None: ...


@dataclass
class StopFlag:
    """Set by signal handlers (train.py); read by the loop between optimizer steps."""

    requested: str | None = None
    requested_at: float | None = None
    checkpoint_now: bool = False


@dataclass
class Run:
    cfg: Config
    model: nn.Module                 # what forward runs (compiled or DDP-wrapped)
    raw_model: nn.Module             # the plain Transformer (for norms, saving)
    optimizer: torch.optim.Optimizer
    device: torch.device
    batches: Iterator[Batch]
    chunks: list[int]                # chunk indices this rank runs each step, in order
    val_batches: list[tuple[torch.Tensor, torch.Tensor]]
    flops_per_token: int
    peak_tflops: float | None
    world: World = field(default_factory=World)
    ddp: Any = None                  # the DistributedDataParallel wrapper, for no_sync on accumulation steps
    tracker: Tracker | None = None
    console: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    stop: StopFlag = field(default_factory=StopFlag)
    checkpointer: CheckpointSaver | None = None
    batch_source: BatchSource | None = None
    hooks: list[StepHook] = field(default_factory=list)
    lab_flops_per_token: int | None = None
    spike_watch: Any = None          # spike.SpikeWatch: consulted before each update (may skip it)
    horizon: Horizon | None = None   # where the schedule ends (None: planned for train.total_steps)
    proposed_end: int = 0            # rank 0's wish for a new end (--budget-fit), agreed at the next boundary
    alert: Callable[[str, str], None] | None = None   # (subject, body) to the configured channels, if any

    def __post_init__(self) -> None:
        if self.horizon is None:
            self.horizon = planned(self.cfg.train.total_steps, self.cfg.optim)

    @property
    def end_step(self) -> int:
        assert self.horizon is not None
        return self.horizon.end_step

    @property
    def world_size(self) -> int:
        return self.world.size

    @property
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cfg.train.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


def param_norm(model: nn.Module) -> float:
    with torch.no_grad():
        norms = [p.detach().float().norm() for p in model.parameters()]
        return float(torch.linalg.vector_norm(torch.stack(norms)))


@torch.no_grad()
def evaluate(run: Run) -> float:
    """Mean loss over the fixed val windows (the same windows at every call), with the plain, eager module: a
    compiled model's first graph must be training's, not an inference-mode eval (pytorch/pytorch#135892), an
    eval must never trigger (or fail in) a compilation, and no rank's eval may enter DDP's hooks."""
    model = run.raw_model
    model.eval()
    total, count = 0.0, 0
    with eager_modules(model):
        for x, y in run.val_batches:
            with run.autocast:
                loss = model(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True))
            total += float(loss) * x.shape[0]
            count += x.shape[0]
    model.train()
    return total / max(count, 1)


class Throughput:
    """Step times over a moving window, skipping the first steps of a process (compile, warm-up)."""

    def __init__(self, window: int, skip: int = 3) -> None:
        self.times: deque[float] = deque(maxlen=window)
        self.skip = skip
        self.seen = 0

    def add(self, seconds: float) -> None:
        self.seen += 1
        if self.seen > self.skip:
            self.times.append(seconds)

    @property
    def warm(self) -> bool:
        return len(self.times) == self.times.maxlen

    def mean_step_s(self) -> float:
        return sum(self.times) / len(self.times) if self.times else float("nan")


def train_step(run: Run, step: int) -> tuple[float, float, float]:
    """One optimizer step over all this rank's chunks. Returns (mean loss, grad norm before clipping, lr)."""
    cfg = run.cfg
    assert run.horizon is not None
    lr = lr_at(step, cfg.optim, run.horizon)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    n = len(run.chunks)
    loss_sum = torch.zeros((), device=run.device)
    for i, chunk in enumerate(run.chunks):
        batch = next(run.batches)
        if (batch.step, batch.chunk) != (step, chunk):  # an invariant of the prefetcher
            raise RuntimeError(f"batch order broken: got {(batch.step, batch.chunk)}, expected {(step, chunk)}")
        if run.batch_source is not None:
            batch = run.batch_source.replace(step, chunk, batch)
        x = batch.x.to(run.device, non_blocking=True)
        y = batch.y.to(run.device, non_blocking=True)
        sync_ctx = run.ddp.no_sync() if run.ddp is not None and i < n - 1 else contextlib.nullcontext()
        with sync_ctx:
            with run.autocast:
                loss = run.model(x, y)
            (loss / n).backward()
        loss_sum += loss.detach()
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), clip))
    loss_value = float(mean_over_ranks(loss_sum / n, run.world))
    if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
        run.optimizer.zero_grad(set_to_none=True)
        raise Diverged(step + 1, loss_value, grad_norm)  # numbered like the console: steps done
    skip = run.spike_watch is not None and run.spike_watch.observe(step, loss_value, grad_norm, cfg.optim.grad_clip)
    if not skip:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_value, grad_norm, lr


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    h, rem = divmod(int(seconds), 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def train_loop(run: Run, state: LoopState) -> Outcome:
    """Run optimizer steps from ``state.step`` to ``train.total_steps``; return how it ended.

    Raises :class:`Diverged` on a NaN/Inf loss or grad norm (no checkpoint is written from those weights).
    """
    cfg = run.cfg.train
    tokens_per_step = run.cfg.tokens_per_step()
    meter = Throughput(cfg.throughput_window)
    run.raw_model.train()
    if state.step == 0:
        _eval_and_log(run, state)  # the starting point of the val curve
    floor = ThroughputFloor()
    _agree_end(run, state.step)
    while state.step < run.end_step:
        step = state.step
        t0 = run.clock()
        loss, grad_norm, lr = train_step(run, step)
        if run.device.type == "cuda":
            torch.cuda.synchronize(run.device)
        dt = run.clock() - t0
        meter.add(dt)
        state.step = step + 1
        if meter.seen == 1:  # this process's first step: compilation and warm-up, worth knowing on a paid GPU
            run.console(f"first step of this process took {dt:.1f} s (compilation and warm-up included)")
            if run.tracker is not None:
                run.tracker.log_metrics(state.step, {N.TRAIN_FIRST_STEP_S: dt})
        state.tokens_seen += tokens_per_step
        state.train_time_s += dt
        state.last_step_s = dt
        state.last_loss = loss
        done = state.step

        metrics: dict[str, float] = {N.TRAIN_LOSS: loss, N.TRAIN_GRAD_NORM: grad_norm,
                                     N.TRAIN_LR: lr}
        end = run.end_step
        logged = done % cfg.log_every == 0 or done == 1 or done == end
        if logged:
            _log_step(run, state, meter, metrics, dt)
        verdict = floor.check(run, state, meter, metrics)

        if done % cfg.eval_every == 0 and done != end:
            _eval_and_log(run, state)

        for hook in run.hooks:
            if verdict is None:
                verdict = hook.after_step(run, state, metrics)

        # Every rank acts on the same decisions at the same step: rank 0's verdict, anyone's signal.
        code, want_ckpt, stop, ckpt_now = agree_max(
            [verdict[0].exit_code if verdict else 0, int(verdict[1]) if verdict else 0,
             int(run.stop.requested is not None), int(run.stop.checkpoint_now)], run.world, run.device)
        if code:
            outcome = verdict[0] if verdict else Outcome(code, "stopped by rank 0", done)
            # A budget stop ends the run for good: its checkpoint is the final one (final.safetensors).
            return _end(run, state, outcome, checkpoint=bool(want_ckpt), final=code == EXIT_BUDGET_CHECKPOINT)

        _agree_end(run, done)
        if run.end_step <= done and not logged:   # the fit pulled the end to this step: it is the last, log it
            _log_step(run, state, meter, metrics, dt)
        periodic = run.checkpointer.due(done, run.cfg.checkpoint.every_steps, run.cfg.checkpoint.every_min) \
            if run.checkpointer is not None and done < run.end_step else None
        if run.checkpointer is not None and periodic:
            run.checkpointer.save(run, state, periodic)
        elif run.checkpointer is not None and ckpt_now:
            run.checkpointer.save(run, state, "requested (SIGUSR1)")
        if ckpt_now:  # a SIGUSR1 that arrived after the agreement is served next step
            run.stop.checkpoint_now = False

        if stop:
            why = run.stop.requested or "a signal to another rank"
            run.console(f"{why} received: stopping after step {done} with a checkpoint")
            outcome = _end(run, state, Outcome(EXIT_INTERRUPTED, f"interrupted by {why}", done), checkpoint=True)
            if run.stop.requested_at is not None:
                run.console(f"clean stop {run.clock() - run.stop.requested_at:.2f} s after {why}")
            return outcome

    if state.last_eval_step != state.step:   # not evaluated at this step already (an end the fit pulled here)
        _eval_and_log(run, state)
    why = "finished" if run.end_step == cfg.total_steps else \
        f"finished at the end the budget fitted (step {run.end_step} of at most {cfg.total_steps})"
    return _end(run, state, Outcome(EXIT_OK, why, state.step), checkpoint=True, final=True)


def _log_step(run: Run, state: LoopState, meter: Throughput, metrics: dict[str, float], dt: float) -> None:
    """The console line and the logged metrics of a logging step. MFU twice: honest (what the GPU did, attention
    included) and the lab's 6N figure (ERRATA 1), each labelled."""
    tokens_per_step = run.cfg.tokens_per_step()
    mean_dt = meter.mean_step_s() if meter.times else dt
    tps = tokens_per_step / mean_dt
    peak = run.peak_tflops * 1e12 * run.world_size if run.peak_tflops else None
    mfu = tps * run.flops_per_token / peak if peak else float("nan")
    mfu_lab = tps * run.lab_flops_per_token / peak if peak and run.lab_flops_per_token else float("nan")
    metrics.update({
        N.TRAIN_PARAM_NORM: param_norm(run.raw_model), N.TRAIN_TOKENS_PER_S: tps, N.TRAIN_MFU: mfu,
        N.TRAIN_MFU_LAB_6N: mfu_lab, N.TRAIN_STEP_TIME_S: mean_dt, N.TRAIN_TOKENS_SEEN: float(state.tokens_seen),
    })
    if run.device.type == "cuda":   # the high-water mark of this process (allocated, not cached)
        metrics[N.TRAIN_PEAK_MEM_GIB] = torch.cuda.max_memory_allocated(run.device) / 2**30
    done, end = state.step, run.end_step
    if run.tracker is not None:
        run.tracker.log_metrics(done, dict(metrics))
    eta = (end - done) * mean_dt
    if math.isfinite(mfu):
        lab = f", lab 6N {mfu_lab * 100:.1f}%" if math.isfinite(mfu_lab) else ""
        mfu_s = f"MFU {mfu * 100:5.1f}% honest{lab}"
    else:
        mfu_s = "MFU n/a (no --peak-tflops)"
    run.console(f"step {done:>7}/{end} | loss {metrics[N.TRAIN_LOSS]:7.4f} | lr {metrics[N.TRAIN_LR]:.2e} | "
                f"grad {metrics[N.TRAIN_GRAD_NORM]:7.3f} | {tps:10,.0f} tok/s | {mfu_s} | ETA {_fmt_eta(eta)}")


class ThroughputFloor:
    """``--min-tokens-per-s``, as the lab means it: during the run's first ``min_tokens_per_s_window_min``
    minutes of training (summed over restarts) a warm window below the floor ends the run (exit 6, to
    diagnose); later a drop is logged and alerted once per episode and training goes on, unless
    ``min_tokens_per_s_always``."""

    def __init__(self) -> None:
        self.below = False   # inside a reported episode (after the window)

    def check(self, run: Run, state: LoopState, meter: Throughput,
              metrics: dict[str, float]) -> tuple[Outcome, bool] | None:
        cfg = run.cfg.train
        tps = metrics.get(N.TRAIN_TOKENS_PER_S)
        if cfg.min_tokens_per_s is None or tps is None or not meter.warm or not run.world.main:
            return None
        if tps >= cfg.min_tokens_per_s:
            if self.below:
                run.console(f"throughput back above --min-tokens-per-s: {tps:,.0f} tokens/s")
            self.below = False
            return None
        what = (f"throughput {tps:,.0f} tokens/s over the last {len(meter.times)} steps is below "
                f"--min-tokens-per-s {cfg.min_tokens_per_s:,.0f}")
        in_window = state.train_time_s <= cfg.min_tokens_per_s_window_min * 60
        if in_window or cfg.min_tokens_per_s_always:
            run.console(f"{what}: stopping to diagnose (exit 6)")
            return Outcome(EXIT_SLOW, "throughput below floor", state.step), True
        if not self.below:
            self.below = True
            run.console(f"warning: {what} at step {state.step}, after the first "
                        f"{cfg.min_tokens_per_s_window_min:g} min: training goes on (diagnose it: another process "
                        "on the GPU, thermal throttling, a slow disk; --min-tokens-per-s-always stops instead)")
            if run.alert is not None:
                run.alert(f"x1 throughput dropped to {tps:,.0f} tokens/s at step {state.step}",
                          f"{what}. The run continues.")
        return None


def _agree_end(run: Run, next_step: int) -> None:
    """Every rank moves the schedule's end at the same step boundary, to rank 0's proposal (--budget-fit).

    A proposal is made during a step and applied at the next boundary, so it can land on this very boundary
    (one or two steps fitted) or, in a race with the check, before it: the run then ends here, as fitted (exit
    0 with the final checkpoint), instead of training on at the old rate until the next check."""
    (end,) = agree_max([run.proposed_end], run.world, run.device)
    run.proposed_end = 0
    assert run.horizon is not None
    if not end or end == run.horizon.end_step:
        return
    if end > next_step:
        run.horizon = retarget(run.horizon, next_step, end, run.cfg.optim)
    elif next_step > 0:
        run.console(f"budget fit: the end it fitted (step {end}) is here already: the run ends at step {next_step}")
        run.horizon = replace(run.horizon, end_step=next_step, decay_start=min(run.horizon.decay_start, next_step),
                              anchor_step=min(run.horizon.anchor_step, next_step))


def _eval_and_log(run: Run, state: LoopState) -> None:
    val = evaluate(run)
    state.last_val_loss, state.last_eval_step = val, state.step
    if run.tracker is not None:
        run.tracker.log_metrics(state.step, {N.VAL_LOSS: val})
    run.console(f"step {state.step:>7} | val loss {val:.4f}")


def _end(run: Run, state: LoopState, outcome: Outcome, checkpoint: bool, final: bool = False) -> Outcome:
    if checkpoint and run.checkpointer is not None:
        run.checkpointer.save(run, state, "final" if final else outcome.reason, required=True)
    return outcome
