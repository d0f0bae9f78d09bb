"""The training loop, as the lab tells it: batch → forward → backward → clip → step → log, until the end;
then a last eval and the final checkpoint. Everything else is a :class:`Callback` told of the loop's phases
(``trainer/callbacks.py``: the eval and checkpoint cadences, the first-step timing, the throughput floor;
the progress file, the spike watch and the budget guard come from the builder).

Everything with a side effect (clock, signals, files, MLflow, the budget file) is built by ``build.py`` and
handed in through :class:`Run`, so tests drive the loop with fakes (``tests/trainer/test_loop.py``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

from ..core import names as N
from ..core.config import Config
from ..core.contract import EXIT_BUDGET_CHECKPOINT, EXIT_INTERRUPTED, EXIT_OK
from ..core.log import as_log
from ..data.tokens import Batch
from .device import CompileFallback, CompileFellBack, eager_modules
from .distributed import World, agree_max, mean_over_ranks
from .optim import set_lr
from .schedule import Horizon, lr_at, planned, retarget


class Diverged(Exception):
    def __init__(self, step: int, loss: float, grad_norm: float) -> None:
        self.step, self.loss, self.grad_norm = step, loss, grad_norm
        super().__init__(f"loss {loss} / grad norm {grad_norm} at step {step}: training diverged")


@dataclass
class LoopState:
    """What a checkpoint must restore besides weights and optimizer: counts of completed work."""

    step: int = 0  # optimizer steps completed (the next step to run has this index)
    tokens_seen: int = 0
    train_time_s: float = 0.0  # wall-clock spent in training steps, summed over restarts
    last_loss: float = float("nan")
    last_val_loss: float = float("nan")
    last_val_bpb: float = float("nan")  # bits per byte at the last eval (NaN: no byte table)
    last_step_s: float = float("nan")  # duration of the latest step (not saved)
    last_eval_step: int = -1  # the step the val loss was last measured at (not saved)


@dataclass
class Outcome:
    exit_code: int
    reason: str
    step: int


class Tracker(Protocol):
    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...


Verdict = tuple[Outcome, bool]  # how the run ends, and whether a checkpoint is written first


@dataclass
class StepReport:
    """One optimizer step as the callbacks see it."""

    step: int  # steps done (the console's numbering)
    dt: float  # its wall-clock seconds
    metrics: dict[str, float]  # train/loss, train/grad_norm, train/lr; the throughput figures when logged
    meter: Throughput
    logged: bool  # a logging step (the console line and the metrics were written)
    checkpoint_now: bool = False  # a SIGUSR1 every rank agreed on (known at the boundary)


class Callback:
    """One concern of a run, told of the loop's phases; each method is optional (the defaults do nothing). In
    the order of a step:

    * ``batch``: each micro-batch before the forward; may replace it (spike injection);
    * ``before_update``: after the backward and clipping; True skips this step's optimizer update;
    * ``after_step``: may end the run with a :data:`Verdict`; the callbacks after the first that does are not
      asked; rank 0's verdict and any rank's signal are agreed by every rank before anything acts on them;
    * ``at_boundary``: every rank agreed to go on (the checkpoint cadence);
    * ``after_eval``, ``after_checkpoint``: whenever the val loss was measured or a checkpoint written;
    * ``on_stop``: the run ended (any way but an exception), after its last checkpoint.

    Every rank runs every phase; a callback for rank 0 only checks ``run.world.main``."""

    def batch(self, step: int, chunk: int, batch: Batch) -> Batch:
        return batch

    def before_update(self, step: int, loss: float, grad_norm: float, grad_clip: float) -> bool:
        return False

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        return None

    def at_boundary(self, run: Run, state: LoopState, report: StepReport) -> None:
        return None

    def after_eval(self, run: Run, state: LoopState, val_loss: float) -> None:
        return None

    def after_checkpoint(self, run: Run, state: LoopState, reason: str) -> None:
        return None

    def on_stop(self, run: Run, state: LoopState, outcome: Outcome) -> None:
        return None


class CheckpointSaver(Protocol):
    def save(self, run: Run, state: LoopState, reason: str, required: bool = False) -> None: ...

    def wait(self) -> None: ...

    def due(self, step: int, every_steps: int, every_min: float) -> str | None: ...


class StepMetrics:
    """The values a run's components record for a step, as OLMo-core's ``record_metric``: the component that
    produces a value names it (a ``core.names`` constant) and records it; the loop sends everything recorded
    to the tracker, one call a step, at each step boundary before a checkpoint can be written there (so a
    checkpoint's MLflow store holds every step it covers), and when the run ends, however it ends. A new
    metric touches only the component that makes it. Thread-safe (a callback may record from a thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, float]] = {}

    def record(self, step: int, values: Mapping[str, float]) -> None:
        if not values:
            return
        with self._lock:
            self._pending.setdefault(step, {}).update(values)

    def flush(self, tracker: Tracker | None) -> None:
        """Everything recorded so far to ``tracker`` (dropped without one), oldest step first."""
        with self._lock:
            pending, self._pending = self._pending, {}
        if tracker is not None:
            for step in sorted(pending):
                tracker.log_metrics(step, pending[step])


@dataclass
class StopFlag:
    """Set by signal handlers (train.py); read by the loop between optimizer steps."""

    requested: str | None = None
    requested_at: float | None = None
    checkpoint_now: bool = False


@dataclass
class Run:
    cfg: Config
    model: nn.Module  # what forward runs (compiled or DDP-wrapped)
    raw_model: nn.Module  # the plain Transformer (for norms, saving)
    optimizer: torch.optim.Optimizer
    device: torch.device
    batches: Iterator[Batch]
    chunks: list[int]  # chunk indices this rank runs each step, in order
    val_batches: list[tuple[torch.Tensor, torch.Tensor]]
    flops_per_token: int
    peak_tflops: float | None
    world: World = field(default_factory=World)
    ddp: Any = None  # the DistributedDataParallel wrapper, for no_sync on accumulation steps
    tracker: Tracker | None = None
    console: Callable[[str], None] = field(default_factory=lambda: as_log(logging.getLogger(__name__)))
    clock: Callable[[], float] = time.monotonic
    stop: StopFlag = field(default_factory=StopFlag)
    checkpointer: CheckpointSaver | None = None
    callbacks: list[Callback] = field(default_factory=list)  # in order; callbacks.loop_callbacks() first
    lab_flops_per_token: int | None = None
    optimizer_flops_per_step: int = 0  # each rank's Newton–Schulz FLOPs a step (Muon), apart from the model's
    horizon: Horizon | None = None  # where the schedule ends (None: planned for train.total_steps)
    proposed_end: int = 0  # rank 0's wish for a new end (--budget-fit), agreed at the next boundary
    alert: Callable[[str, str], None] | None = None  # (subject, body) to the configured channels, if any
    metrics: StepMetrics = field(default_factory=StepMetrics)  # what components record for a step
    val_token_bytes: torch.Tensor | None = None  # (vocab,) int64: the UTF-8 bytes of each id (bits per byte)

    def record_metric(self, step: int, name: str, value: float) -> None:
        """Record ``name`` = ``value`` for ``step``; the loop logs it with the step's other values."""
        self.metrics.record(step, {name: value})

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
    """Mean loss over the fixed val windows (the same windows at every call)."""
    return val_scores(run)[0]


@torch.no_grad()
def val_scores(run: Run) -> tuple[float, float]:
    """(val loss in nats a token, bits per byte) over the fixed val windows, with the plain, eager module: a
    compiled model's first graph must be training's, not an inference-mode eval (pytorch/pytorch#135892), an
    eval must never trigger (or fail in) a compilation, and no rank's eval may enter DDP's hooks.

    Bits per byte: the nats of the targets that stand for text, summed, / ln 2 / the UTF-8 bytes of those
    targets (``run.val_token_bytes[id]``; the end-of-text separator, 0 bytes, is in neither sum). It does not
    depend on how the tokenizer cuts the text, so runs with different tokenizers compare; NaN without a table."""
    model = run.raw_model
    nats, count, text_nats, n_bytes = 0.0, 0, 0.0, 0
    table = run.val_token_bytes
    with scoring_mode(model):
        for x, y in run.val_batches:
            with run.autocast:
                per = model.token_nats(x.to(run.device, non_blocking=True), y.to(run.device, non_blocking=True))
            per = per.double().cpu()
            nats += float(per.sum())
            count += per.numel()
            if table is not None:
                b = table[y.reshape(-1)]
                text_nats += float(per[b > 0].sum())
                n_bytes += int(b.sum())
    bpb = text_nats / math.log(2) / n_bytes if n_bytes else math.nan
    return nats / max(count, 1), bpb


@contextlib.contextmanager
def scoring_mode(model: nn.Module) -> Iterator[None]:
    """The plain model in eval mode, blocks compiled in place run eagerly; back to training mode after, however
    the block ends (the val loss and the task scores both score this way)."""
    model.eval()
    try:
        with eager_modules(model):
            yield
    finally:
        model.train()


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


def _accumulate(run: Run, batches: list[Batch]) -> torch.Tensor:
    """Forward and backward over this step's micro-batches (DDP syncs on the last); the summed loss."""
    n = len(batches)
    backward = run.model.backward if isinstance(run.model, CompileFallback) else None
    loss_sum = torch.zeros((), device=run.device)
    for i, batch in enumerate(batches):
        x = batch.x.to(run.device, non_blocking=True)
        y = batch.y.to(run.device, non_blocking=True)
        sync_ctx = run.ddp.no_sync() if run.ddp is not None and i < n - 1 else contextlib.nullcontext()
        with sync_ctx:
            with run.autocast:
                loss = run.model(x, y)
            if backward is not None:
                backward(loss / n)
            else:
                (loss / n).backward()
        loss_sum += loss.detach()
    return loss_sum


def train_step(run: Run, step: int) -> tuple[float, float, float]:
    """One optimizer step over all this rank's chunks. Returns (mean loss, grad norm before clipping, lr)."""
    cfg = run.cfg
    assert run.horizon is not None
    lr = lr_at(step, cfg.optim, run.horizon)
    set_lr(run.optimizer, lr, cfg.optim)
    batches = []
    for chunk in run.chunks:
        batch = next(run.batches)
        if (batch.step, batch.chunk) != (step, chunk):  # an invariant of the prefetcher
            raise RuntimeError(f"batch order broken: got {(batch.step, batch.chunk)}, expected {(step, chunk)}")
        for cb in run.callbacks:
            batch = cb.batch(step, chunk, batch)
        batches.append(batch)
    n = len(batches)
    try:
        loss_sum = _accumulate(run, batches)
    except CompileFellBack:  # the backward's compile failed: the fallback is eager now, the step starts again
        run.optimizer.zero_grad(set_to_none=True)
        loss_sum = _accumulate(run, batches)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.raw_model.parameters(), clip))
    loss_value = float(mean_over_ranks(loss_sum / n, run.world))
    if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
        run.optimizer.zero_grad(set_to_none=True)
        raise Diverged(step + 1, loss_value, grad_norm)  # numbered like the console: steps done
    skips = [cb.before_update(step, loss_value, grad_norm, cfg.optim.grad_clip) for cb in run.callbacks]
    if not any(skips):
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return loss_value, grad_norm, lr


def _fmt_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    h, rem = divmod(int(seconds), 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def train_loop(run: Run, state: LoopState) -> Outcome:
    """Run optimizer steps from ``state.step`` to the schedule's end; return how it ended.

    Raises :class:`Diverged` on a NaN/Inf loss or grad norm (no checkpoint is written from those weights).
    """
    try:
        return _steps(run, state)
    finally:  # however the run ends: what its components recorded reaches the tracker
        run.metrics.flush(run.tracker)


def _steps(run: Run, state: LoopState) -> Outcome:
    meter = Throughput(run.cfg.train.throughput_window)
    run.raw_model.train()
    if state.step == 0:
        evaluate_and_tell(run, state)  # the starting point of the val curve
    _agree_end(run, state.step)
    while state.step < run.end_step:
        report = _one_step(run, state, meter)
        verdict = next((v for cb in run.callbacks if (v := cb.after_step(run, state, report)) is not None), None)
        # Every rank acts on the same decisions at the same step: rank 0's verdict, anyone's signal.
        code, want_ckpt, stop, ckpt_now = agree_max(
            [
                verdict[0].exit_code if verdict else 0,
                int(verdict[1]) if verdict else 0,
                int(run.stop.requested is not None),
                int(run.stop.checkpoint_now),
            ],
            run.world,
            run.device,
        )
        if code:
            outcome = verdict[0] if verdict else Outcome(code, "stopped by rank 0", report.step)
            # A budget stop ends the run for good: its checkpoint is the final one (final.safetensors).
            return _end(run, state, outcome, checkpoint=bool(want_ckpt), final=code == EXIT_BUDGET_CHECKPOINT)
        _agree_end(run, report.step)
        if run.end_step <= report.step and not report.logged:  # the fit pulled the end here: the last step
            _log_step(run, state, report)
        report.checkpoint_now = bool(ckpt_now)
        run.metrics.flush(run.tracker)  # the step's values, one call, before a checkpoint at this boundary
        for cb in run.callbacks:
            cb.at_boundary(run, state, report)
        run.metrics.flush(run.tracker)  # what the boundary's callbacks recorded
        if ckpt_now:  # a SIGUSR1 that arrived after the agreement is served next step
            run.stop.checkpoint_now = False
        if stop:
            why = run.stop.requested or "a signal to another rank"
            run.console(f"{why} received: stopping after step {report.step} with a checkpoint")
            return _end(run, state, Outcome(EXIT_INTERRUPTED, f"interrupted by {why}", report.step), checkpoint=True)

    if state.last_eval_step != state.step:  # not evaluated at this step already (an end the fit pulled here)
        evaluate_and_tell(run, state)
    total = run.cfg.train.total_steps
    why = (
        "finished"
        if run.end_step == total
        else f"finished at the end the budget fitted (step {run.end_step} of at most {total})"
    )
    return _end(run, state, Outcome(EXIT_OK, why, state.step), checkpoint=True, final=True)


def _one_step(run: Run, state: LoopState, meter: Throughput) -> StepReport:
    """One optimizer step, timed, counted and (at its cadence) logged."""
    t0 = run.clock()
    loss, grad_norm, lr = train_step(run, state.step)
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    dt = run.clock() - t0
    meter.add(dt)
    state.step += 1
    state.tokens_seen += run.cfg.tokens_per_step()
    state.train_time_s += dt
    state.last_step_s = dt
    state.last_loss = loss
    report = StepReport(
        state.step, dt, {N.TRAIN_LOSS: loss, N.TRAIN_GRAD_NORM: grad_norm, N.TRAIN_LR: lr}, meter, logged=False
    )
    done, every = state.step, run.cfg.train.log_every
    if done % every == 0 or done == 1 or done == run.end_step:
        _log_step(run, state, report)
    return report


def _log_step(run: Run, state: LoopState, report: StepReport) -> None:
    """The console line and the logged metrics of a logging step. MFU twice: honest (what the GPU did, attention
    included) and the lab's 6N figure (docs/errata.md, 1), each labelled."""
    report.logged = True
    metrics, meter = report.metrics, report.meter
    tokens_per_step = run.cfg.tokens_per_step()
    mean_dt = meter.mean_step_s() if meter.times else report.dt
    tps = tokens_per_step / mean_dt
    peak = run.peak_tflops * 1e12 * run.world_size if run.peak_tflops else None
    mfu = tps * run.flops_per_token / peak if peak else float("nan")
    mfu_lab = tps * run.lab_flops_per_token / peak if peak and run.lab_flops_per_token else float("nan")
    # Muon's orthogonalisation: every rank runs it on every matrix, so each device's share is the whole of it
    mfu_opt = run.optimizer_flops_per_step * run.world_size / mean_dt / peak if peak else float("nan")
    metrics.update(
        {
            N.TRAIN_PARAM_NORM: param_norm(run.raw_model),
            N.TRAIN_TOKENS_PER_S: tps,
            N.TRAIN_MFU: mfu,
            N.TRAIN_MFU_LAB_6N: mfu_lab,
            **({N.TRAIN_MFU_NEWTON_SCHULZ: mfu_opt} if run.optimizer_flops_per_step else {}),
            N.TRAIN_STEP_TIME_S: mean_dt,
            N.TRAIN_TOKENS_SEEN: float(state.tokens_seen),
        }
    )
    if run.device.type == "cuda":  # the high-water mark of this process (allocated, not cached)
        metrics[N.TRAIN_PEAK_MEM_GIB] = torch.cuda.max_memory_allocated(run.device) / 2**30
    done, end = state.step, run.end_step
    run.metrics.record(done, metrics)
    eta = (end - done) * mean_dt
    if math.isfinite(mfu):
        lab = f", lab 6N {mfu_lab * 100:.1f}%" if math.isfinite(mfu_lab) else ""
        ns = f" + {mfu_opt * 100:.2f}% Newton–Schulz" if run.optimizer_flops_per_step else ""
        mfu_s = f"MFU {mfu * 100:5.1f}% honest{ns}{lab}"
    else:
        mfu_s = "MFU n/a (no --peak-tflops)"
    run.console(
        f"step {done:>7}/{end} | loss {metrics[N.TRAIN_LOSS]:7.4f} | lr {metrics[N.TRAIN_LR]:.2e} | "
        f"grad {metrics[N.TRAIN_GRAD_NORM]:7.3f} | {tps:10,.0f} tok/s | {mfu_s} | ETA {_fmt_eta(eta)}"
    )


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
        run.horizon = replace(
            run.horizon,
            end_step=next_step,
            decay_start=min(run.horizon.decay_start, next_step),
            anchor_step=min(run.horizon.anchor_step, next_step),
        )


def evaluate_and_tell(run: Run, state: LoopState) -> float:
    """Measure the val loss now and tell the callbacks (``after_eval``: the log line and the metric)."""
    val, state.last_val_bpb = val_scores(run)
    state.last_val_loss, state.last_eval_step = val, state.step
    for cb in run.callbacks:
        cb.after_eval(run, state, val)
    return val


def save_and_tell(run: Run, state: LoopState, reason: str, required: bool = False) -> None:
    """Write a checkpoint (``run.checkpointer``) and tell the callbacks (``after_checkpoint``)."""
    if run.checkpointer is None:
        return
    run.checkpointer.save(run, state, reason, required=required)
    for cb in run.callbacks:
        cb.after_checkpoint(run, state, reason)


def _end(run: Run, state: LoopState, outcome: Outcome, checkpoint: bool, final: bool = False) -> Outcome:
    run.metrics.flush(run.tracker)  # a checkpoint's MLflow store holds every step it covers
    if checkpoint:
        save_and_tell(run, state, "final" if final else outcome.reason, required=True)
    for cb in run.callbacks:
        cb.on_stop(run, state, outcome)
    return outcome
