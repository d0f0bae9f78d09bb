"""Turn a resolved config and the trainer's options into a ready :class:`~x1_pretrain.trainer.loop.Run`:
data, model, optimizer, tracking, checkpoints, spikes and the budget monitor, each built by one small
function, so ``session.py`` can read as: gate → build → loop → exit code."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ..budget import alerts
from ..budget.gate import expected_step_s
from ..budget.ledger import LEDGER_FILE
from ..ckpt import checkpoint as ck
from ..ckpt.checkpointer import CheckpointCalls, Checkpointer
from ..core import config as C
from ..core import contract, redact
from ..core import names as N
from ..core.env import machine, versions
from ..core.errors import DataError, TokenizerNotFound, X1Error
from ..core.log import Log, as_log
from ..data.tokens import Prefetcher, Sampler, TokenData, gather, open_token_data, val_starts
from ..model import flops
from ..model.transformer import Transformer, state_dict_for_saving
from ..trainer.budget_control import BudgetControl, FitContext
from ..trainer.callbacks import MirrorRefused, ProgressFile, loop_callbacks
from ..trainer.device import (
    CompileFallback,
    check_deterministic_compile,
    compile_model,
    effective_compile_mode,
    effective_compile_scope,
    forward_kernels,
    hardware_plan,
    make_deterministic,
    seed_everything,
)
from ..trainer.distributed import World
from ..trainer.loop import LoopState, Run, StepMetrics, StopFlag
from ..trainer.optim import build_optimizer, describe, newton_schulz_flops_per_step
from ..trainer.schedule import Horizon, planned
from ..trainer.spike import (
    SpikeDetector,
    SpikeInjector,
    SpikeReport,
    SpikeSchedule,
    SpikeWatch,
    rare_token_distribution,
    unigram_counts,
)
from ..trainer.tracking import resolve_uri
from .options import TrainOptions, eval_cost
from .resume import RankStart, Resume, agree_on_checkpoint, find_resume, restore
from .run_record import kernel_tags, open_tracker, restarts, run_tags_device, tag_final


@dataclass
class Context:
    """Everything the session decided before building: config, options, where and how to run."""

    cfg: C.Config
    opts: TrainOptions
    world: World
    device: Any
    log: Log
    stop: StopFlag
    started_unix: float
    guard: Any = None  # trainer.budget_control.BudgetSetup when a cap is set (rank 0 only), else None
    deadline: Any = None  # signals.StopDeadline: what is left of --stop-grace-s after a stop request
    on_built: Callable[[Any], None] | None = None  # told the Built once it is ready (the stop deadline's view)
    mirror: Any = None  # ckpt.mirror.Mirror with --ckpt-remote (rank 0 only), else None
    mlflow_store: Any = None  # ckpt.mirror.MlflowStore on this disk (the mirror copies it), else None

    @property
    def ckpt_dir(self) -> Path:
        return self.opts.ckpt_dir

    @property
    def peak_tflops(self) -> float | None:
        """The device's bf16 peak (None on a CPU unless --peak-tflops)."""
        name = run_tags_device(self.device) if self.device.type == "cuda" else None
        return flops.peak_tflops(name, self.opts.peak_tflops)


@dataclass
class Built:
    """A ready run and what must be closed after it."""

    run: Run
    state: LoopState
    resume: Resume
    tracker: Any
    checkpointer: Checkpointer | None
    guard: BudgetControl | None
    sampler: Sampler
    data: TokenData
    prefetch: Prefetcher | None = None


def _open_store(ctx: Context) -> tuple[TokenData, str, str | None]:
    data = open_token_data(ctx.opts.data_dir, ctx.cfg.model.vocab_size, ctx.cfg.model.seq_len)
    try:
        ctx.ckpt_dir.mkdir(parents=True, exist_ok=True)
        uri, artifact_location = resolve_uri(ctx.opts.mlflow_uri, ctx.ckpt_dir)
    except ValueError as e:
        raise X1Error(str(e)) from None
    except OSError as e:
        raise X1Error(
            f"--ckpt-dir {ctx.ckpt_dir} cannot be created or written ({e.strerror}); choose a writable directory"
        ) from None
    return data, uri, artifact_location


def _model(ctx: Context, resume: Resume) -> tuple[Transformer, Any, Any, LoopState]:
    """(plain model, what forward runs (DDP and/or compiled), optimizer, loop state)."""
    import torch

    cfg, device, log = ctx.cfg, ctx.device, ctx.log
    use_flash = hardware_plan(cfg, device, log)
    check_deterministic_compile(cfg, device)
    if cfg.train.deterministic:
        make_deterministic(device, log)
    seed_everything(cfg.train.seed)
    model = Transformer(cfg.model).to(device)
    model.set_kernels(forward_kernels(cfg, device, use_flash, log))
    use_flash = model.kernels.use_flash
    optimizer = build_optimizer(model, cfg, device)
    state = LoopState()
    if resume.found is not None:
        state = restore(resume.found, model, optimizer, device, log if ctx.opts.reset_optimizer else None)
        log(f"resuming from {resume.found.path} at step {state.step} ({state.tokens_seen:,} tokens seen)")
    dev_name = run_tags_device(device)
    log(
        f"config {ctx.opts.config} sha256 {cfg.sha256()[:12]} | device {dev_name} | "
        f"attention {'flash-attn' if use_flash else 'SDPA'} | precision {cfg.train.precision}"
    )
    for line in flops.describe(
        cfg.model, dev_name if device.type == "cuda" else None, ctx.opts.peak_tflops
    ).splitlines():
        log(line)
    log(describe(optimizer))
    ns = newton_schulz_flops_per_step(optimizer)
    if ns:
        step_model = flops.flops_per_token(cfg.model).honest * cfg.tokens_per_step() / ctx.world.size
        log(
            f"Newton–Schulz: {ns:.3e} FLOPs a step on each rank ({ns / step_model:.2%} of the model's "
            f"{step_model:.3e}), logged apart as {N.TRAIN_MFU_NEWTON_SCHULZ}"
        )
    forward: Any = model
    if ctx.world.size > 1:
        # broadcast_buffers off: the only buffers are the RoPE tables, the same on every rank. (Newer torch
        # renames the flag with a FutureWarning; the old name is the one torch 2.5 knows.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            forward = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
            )
    return model, forward, optimizer, state


def _spikes(ctx: Context, data: TokenData, tracker: Any, resume: Resume, recorded: StepMetrics) -> SpikeWatch:
    cfg, sp, log = ctx.cfg, ctx.opts.spike, ctx.log
    injector = None
    if sp.inject_at_step is not None:
        counts = unigram_counts(data.directory, data.train, cfg.model.vocab_size, cache_dir=ctx.ckpt_dir, log=log)
        ids, probs = rare_token_distribution(counts, data.meta.get("eot_id"))
        injector = SpikeInjector(SpikeSchedule(sp.inject_at_step, sp.batches), ids, probs, cfg.train.seed)
        last = sp.inject_at_step + sp.batches - 1
        tracker.set_tags(
            {
                N.TAG_SPIKE_INJECTION: f"steps {sp.inject_at_step}..{last} "
                f"(--inject-spike-at-step {sp.inject_at_step} --spike-batches {sp.batches})",
                N.TAG_SPIKE_INJECT_AT_STEP: sp.inject_at_step,
                N.TAG_SPIKE_BATCHES: sp.batches,
            }
        )
        log(
            f"spike injection planned: steps {sp.inject_at_step}..{last} on rare-token batches "
            f"({len(ids)} rarest token types of the train split)"
        )
    sc = cfg.spike
    watch = SpikeWatch(
        SpikeDetector(sc.ema_alpha, sc.baseline_steps, sc.loss_sigma, sc.min_loss_jump, sc.grad_factor, sc.grad_window),
        injector,
        sc.skip_steps,
        sp.force_inject,
        SpikeReport(log, recorded.record, tracker.set_tags),
        lr_warmup_steps=cfg.optim.warmup_steps,
    )
    if resume.state.get("spike"):
        watch.load_state(resume.state["spike"])
    return watch


@dataclass(frozen=True, kw_only=True)
class TrainerState:
    """Builds ``trainer_state.json`` for each checkpoint: counts, RNG, data position, config, provenance. Built
    whole, once everything it reads exists (``build_run``)."""

    ctx: Context
    data: TokenData
    sampler: Sampler
    tracker: Any
    uri: str  # the MLflow store (redacted when written)
    spike_watch: Any  # spike.SpikeWatch
    monitor: Any  # budget.monitor.BudgetMonitor, or None without a cap
    wall_before: float  # wall clock of the run's earlier processes (the resumed checkpoint's)
    machine: dict[str, Any] = field(default_factory=machine)

    def __call__(self, run: Any, st: LoopState) -> dict[str, Any]:
        cfg = self.ctx.cfg
        chunks = cfg.train.grad_accum_steps  # micro-batches a step over all ranks
        return {
            "step": st.step,
            "tokens_seen": st.tokens_seen,
            "train_time_s": st.train_time_s,
            "wall_clock_s": time.time() - self.ctx.started_unix + self.wall_before,
            "last_loss": st.last_loss,
            "last_val_loss": st.last_val_loss,
            "last_val_bpb": st.last_val_bpb,
            "rng": ck.rng_state(),
            "data_position": {
                "next_step": st.step,
                "seed": cfg.train.seed,
                "chunks_per_step": chunks,
                "micro_batch_size": cfg.train.micro_batch_size,
                "epoch": self.sampler.epoch_of(st.step),
            },
            "data_dir": str(self.data.directory),
            "data_identity": self.data.identity,
            "tokenizer_sha256": self.data.tokenizer_sha256,
            "tokenizer": {k: self.data.meta.get(k) for k in ("tokenizer", "vocab_size", "eot_id", "eot_token")},
            "config_sha256": cfg.sha256(),
            "config": cfg.to_dict(),
            "mlflow_uri": redact.url(self.uri),
            "mlflow_run_id": self.tracker.run_id,
            "restarts": restarts(),
            "budget_guard": self.monitor.snapshot_json() if self.monitor is not None else None,
            "schedule": run.horizon.to_json() if getattr(run, "horizon", None) is not None else None,
            "spike": self.spike_watch.state() if self.spike_watch is not None else None,
            "versions": versions(),
            "world_size": self.ctx.world.size,
            "machine": self.machine,
            "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def alert_sender(ctx: Context) -> Callable[[str, str], None] | None:
    """(subject, body) -> the configured alert channels within a deadline; None when there are none (or not rank 0)."""
    if not ctx.world.main:
        return None
    alerter = ctx.guard.alerter if ctx.guard is not None else alerts.from_env()
    if not alerter.channels():
        return None

    def send(subject: str, body: str) -> None:
        alerter.send_within(subject, body)

    return send


def _checkpointer(
    ctx: Context, tracker: Any, trainer_state: TrainerState, resume: Resume, alert: Callable[[str, str], None] | None
) -> Checkpointer | None:
    if not ctx.world.main:
        return None

    def on_failed(step: int, reason: str, what: str, first: bool) -> None:
        latest = ck.read_latest(ctx.ckpt_dir)
        tracker.set_tags(
            {
                N.TAG_CHECKPOINT_FAILED: f"{ck.step_dir_name(step)} ({reason}): {what}"[:4000],
                N.TAG_CHECKPOINT_FAILURES: checkpointer.failures,
            }
        )
        tracker.log_metrics(step, {N.CHECKPOINT_FAILED: 1.0})
        if alert is not None and first:  # one alert per episode; the next is when writes succeed again
            alert(
                f"x1 checkpoint {ck.step_dir_name(step)} FAILED in {ctx.ckpt_dir}",
                f"The {reason} checkpoint of step {step} could not be written: {what}.\n"
                f"The latest complete checkpoint is {latest or '(none yet)'}. Free space on the disk of "
                f"{ctx.ckpt_dir}; training goes on and tries again on schedule (no further alert until a "
                "checkpoint is written again).",
            )

    def on_recovered(step: int, failed: int) -> None:
        if alert is not None:
            alert(
                f"x1 checkpoints written again ({ck.step_dir_name(step)})",
                f"After {failed} failed attempt(s), the checkpoint of step {step} was written to {ctx.ckpt_dir}.",
            )

    def on_saved(step: int, path: Path, secs: float, size: int) -> None:
        tracker.log_metrics(
            step,
            {
                N.CHECKPOINT_SAVE_S: secs,
                N.CHECKPOINT_MB_PER_S: size / 1e6 / max(secs, 1e-9),
                N.CHECKPOINT_SIZE_MB: size / 1e6,
            },
        )
        if ctx.mirror is not None:  # staged now (before the prune), uploaded by the mirror's thread
            try:
                ctx.mirror.checkpoint(path)
            except OSError as e:  # the mirror must never fail a checkpoint that is on disk
                ctx.log(f"warning: {path.name} could not be staged for the mirror ({e}); the next one will be")
            for name in (LEDGER_FILE, contract.EXIT_STATUS):
                ctx.mirror.file(name)
            if ctx.mlflow_store is not None:
                ctx.mirror.mlflow(ctx.mlflow_store)

    def before_save() -> None:
        # Every metric up to a checkpoint is in the store before the checkpoint exists: a process killed
        # later loses only metrics of steps that its resumed successor replays and logs again.
        if tracker.reachable:
            tracker.flush(timeout_s=10.0)

    calls = CheckpointCalls(
        state_dict_for_saving,
        trainer_state,
        ctx.log,
        on_saved,
        lambda path, hashes: tag_final(tracker, ctx.ckpt_dir, path, hashes),
        before_save,
        on_failed,
        on_recovered,
    )
    checkpointer = Checkpointer(ctx.ckpt_dir, ctx.cfg.checkpoint.keep_last, ctx.cfg.checkpoint.async_save, calls)
    if resume.found is not None:
        checkpointer.last_saved_step = resume.found.step
    return checkpointer


def _fit_context(ctx: Context, resume: Resume) -> FitContext | None:
    cfg = ctx.cfg
    b = cfg.budget
    if not b.fit:
        return None
    fpt = flops.flops_per_token(cfg.model).honest
    peak = ctx.peak_tflops * ctx.world.size if ctx.peak_tflops else None  # a step is made by every rank's GPU
    step_s = expected_step_s(b.expected_step_s, cfg.tokens_per_step(), fpt, peak, b.assumed_mfu)
    first_start = ctx.started_unix - float(resume.state.get("wall_clock_s", 0.0))
    return FitContext(
        total_steps=cfg.train.total_steps,
        optim=cfg.optim,
        expected_step_s=step_s,
        max_hours=b.max_hours,
        first_start_estimate_unix=first_start,
    )


def _horizon(cfg: C.Config, resume: Resume) -> Horizon:
    """The schedule's end: what a checkpoint of a budget-fitted run recorded, else the plan."""
    saved = resume.state.get("schedule")
    if cfg.budget.fit and isinstance(saved, dict):
        h = Horizon.from_json(saved)
        if h.end_step <= cfg.train.total_steps:
            return h
    return planned(cfg.train.total_steps, cfg.optim)


DataTokenizer = tuple[Any, "X1Error | None"]  # (the data's tokenizer, or None and why it could not be loaded)


def _data_tokenizer(data: TokenData) -> DataTokenizer:
    """The tokenizer that made the data, loaded once for everything at launch that needs it (the task scores'
    encoder, val/bpb's byte table)."""
    from ..data import hf_tokenizer

    try:
        return hf_tokenizer.of_data(data.directory, data.meta), None
    except (DataError, TokenizerNotFound) as e:
        return None, e


def _task_eval(ctx: Context, loaded: DataTokenizer) -> list[Any]:
    """The in-loop task scores (rank 0), their sets read (fetched on first use) before anything else is built: a
    missing set is a usage error now, not a failure hours in."""
    if not ctx.cfg.train.eval_tasks.strip() or not ctx.world.main:
        return []
    from ..evals.registry import task_list
    from ..evals.run import load_items
    from ..trainer.task_eval import TaskEval

    t = ctx.cfg.train
    names = task_list(t.eval_tasks)
    items, _ = load_items(names, t.eval_tasks_limit)
    ctx.log(
        f"task eval: {', '.join(names)} ({sum(len(v) for v in items.values()):,} items) "
        + (f"every {t.eval_tasks_every} steps and " if t.eval_tasks_every else "")
        + "when the run ends, within "
        f"{t.eval_tasks_max_s:g} s each time"
    )
    tok, why = loaded
    if why is not None:  # the scores need the model's own ids
        raise why
    return [TaskEval(items, tok.encode, ctx.log, alert_sender(ctx), eval_cost(ctx.cfg))]


def keep_tokenizer(data: TokenData, ckpt_dir: Path) -> None:
    """A copy of the data's tokenizer.json in the checkpoint dir (where none is yet), so the run's checkpoints
    export and sample without the data dir; GPT-2's BPE is x1's own and is not copied. Written after the resume
    check: a checkpoint dir's tokenizer is never replaced by another data's."""
    from ..core.fileio import write_text_atomic

    if data.meta.get("tokenizer", "gpt2") == "gpt2":
        return
    src = data.directory / str(data.meta.get("tokenizer_file") or "tokenizer.json")
    dest = ckpt_dir / "tokenizer.json"
    if src.is_file() and not dest.exists():
        write_text_atomic(dest, src.read_text(encoding="utf-8"))


def _val_token_bytes(loaded: DataTokenizer, log: Log) -> Any:
    """The UTF-8 bytes of each id of the data's tokenizer (val/bpb's denominator), or None with a note when the
    tokenizer cannot be loaded (the run trains; it logs val/loss only)."""
    import torch

    tok, why = loaded
    if why is not None:
        log(f"warning: no val/bpb for this run: the data's tokenizer cannot be loaded ({str(why).splitlines()[0]})")
        return None
    return torch.from_numpy(tok.token_bytes())


def _val_batches(ctx: Context, data: TokenData, resume: Resume) -> list[Any]:
    """The fixed val windows, eval_batches micro-batches' worth: on a resume with another micro-batch (and the
    same eval_batches) the run's own set, so val/loss keeps measuring the same windows."""
    t = ctx.cfg.train
    saved = resume.state.get("config", {}).get("train", {})
    micro = t.micro_batch_size
    if saved.get("eval_batches") == t.eval_batches:
        micro = int(saved.get("micro_batch_size") or micro)
    starts = val_starts(data.val.size, ctx.cfg.model.seq_len, t.eval_batches * micro)
    return [
        gather(data.val, starts[i : i + t.micro_batch_size], ctx.cfg.model.seq_len)
        for i in range(0, len(starts), t.micro_batch_size)
    ]


def _compile_fallback_report(ctx: Context, tracker: Any, alert: Any) -> Any:
    def report(error: str) -> None:
        tracker.set_tags({N.TAG_COMPILE_FALLBACK: error[:4000], N.TAG_COMPILE_MODE_EFFECTIVE: "eager (fallback)"})
        if alert is not None:
            alert(
                f"x1 torch.compile failed in {ctx.ckpt_dir}: training continues eagerly",
                f"torch.compile raised {error}. The run goes on without compilation (slower, and every hour "
                "costs the same). Fix the cause and relaunch with --resume-from-latest, or pass --no-compile.",
            )

    return report


def _resume(ctx: Context, data: TokenData) -> Resume:
    """Where this run starts; with several ranks, where all of them start (``resume.agree_on_checkpoint``)."""
    find = partial(find_resume, ctx.ckpt_dir, ctx.opts, ctx.cfg, data, ctx.log, ctx.world.size)
    if ctx.world.size == 1:
        return find()
    resume, problem = Resume(), None  # only rank 0 refuses a fresh start over old checkpoints
    try:
        if ctx.world.main or ctx.opts.resume:
            resume = find()
    except X1Error as e:  # every rank learns it and exits 2 with it (none is left waiting)
        problem = str(e)
    start = RankStart(resume, problem, (ctx.cfg.sha256(), data.identity))
    return agree_on_checkpoint(start, ctx.ckpt_dir, ctx.world, ctx.device, ctx.log)


def build_run(ctx: Context) -> Built:
    """Build everything the loop needs, in the order the log tells it."""
    cfg, log = ctx.cfg, ctx.log
    data, uri, artifact_location = _open_store(ctx)
    tokenizer = _data_tokenizer(data)
    task_eval = _task_eval(ctx, tokenizer)
    resume = _resume(ctx, data)
    if ctx.world.main:
        keep_tokenizer(data, ctx.ckpt_dir)
    model, forward, optimizer, state = _model(ctx, resume)
    ddp = forward if ctx.world.size > 1 else None
    fallback: CompileFallback | None = None
    mode, scope = "off", str(cfg.train.compile_scope)
    if cfg.train.compile:
        micro_steps = len(ctx.world.chunks(cfg.train.grad_accum_steps))
        mode, why = effective_compile_mode(cfg.train.compile_mode, micro_steps)
        scope, why_scope = effective_compile_scope(cfg.train.compile_scope, micro_steps, ctx.world.size)
        for line in (why, why_scope):
            if line:
                log(line)
        log(f"torch.compile mode={mode}, scope {scope} (first step includes compilation)")
        forward = fallback = compile_model(model, forward, mode, scope, log)
        fallback.distributed = ctx.world.size > 1
    sampler = Sampler(
        data.train.size, cfg.model.seq_len, cfg.train.seed, cfg.train.micro_batch_size, cfg.train.grad_accum_steps
    )  # micro-batches a step over all ranks
    val_batches = _val_batches(ctx, data, resume)
    log(
        f"data {data.directory}: {data.train.size:,} train tokens ({sampler.n_windows:,} windows), "
        f"{data.val.size:,} val tokens ({sum(len(x) for x, _ in val_batches)} fixed eval windows); "
        f"{cfg.train.total_steps} steps = {sampler.epoch_of(cfg.train.total_steps):.2f} epochs"
    )
    tracker = open_tracker(ctx, uri, artifact_location, resume, data)
    kernels = kernel_tags(model, cfg.train.precision)
    log(
        f"attention runs on {kernels[N.TAG_ATTENTION_EFFECTIVE]}"
        + ("" if ctx.device.type != "cuda" or cfg.train.sdpa_cudnn else " (cuDNN SDPA off: train.sdpa_cudnn)")
    )
    tracker.set_tags({N.TAG_COMPILE_MODE_EFFECTIVE: mode, N.TAG_COMPILE_SCOPE_EFFECTIVE: scope, **kernels})
    recorded = StepMetrics()  # what the loop's components record for a step
    spike_watch = _spikes(ctx, data, tracker, resume, recorded)
    control = (
        BudgetControl(
            ctx.guard,
            ctx.ckpt_dir,
            log,
            tracker.log_metrics,
            ck.guard_snapshot(resume.state),
            _fit_context(ctx, resume),
            task_eval[0].cost if task_eval else None,
        )
        if ctx.guard is not None
        else None
    )
    if control is not None and ctx.mirror is not None:
        control.ledger.on_saved = lambda: ctx.mirror.file(LEDGER_FILE)  # at each budget check
    trainer_state = TrainerState(
        ctx=ctx,
        data=data,
        sampler=sampler,
        tracker=tracker,
        uri=uri,
        spike_watch=spike_watch,
        monitor=control.monitor if control is not None else None,
        wall_before=float(resume.state.get("wall_clock_s", 0.0)),
    )
    alert = alert_sender(ctx)
    if fallback is not None:
        fallback.on_fallback = _compile_fallback_report(ctx, tracker, alert)
    checkpointer = _checkpointer(ctx, tracker, trainer_state, resume, alert)
    callbacks = loop_callbacks() + task_eval
    if checkpointer is not None:
        callbacks.append(ProgressFile(ctx.ckpt_dir, ctx.started_unix, checkpointer))
    callbacks.append(spike_watch)
    if control is not None:
        callbacks.append(control)
    if ctx.mirror is not None:
        callbacks.append(MirrorRefused(ctx.mirror))
    fpt = flops.flops_per_token(cfg.model)
    peak = ctx.peak_tflops
    run = Run(
        cfg=cfg,
        model=forward,
        raw_model=model,
        optimizer=optimizer,
        device=ctx.device,
        batches=iter(()),
        chunks=ctx.world.chunks(cfg.train.grad_accum_steps),
        val_batches=val_batches,
        flops_per_token=fpt.honest,
        world=ctx.world,
        ddp=ddp,
        peak_tflops=peak,
        tracker=tracker,
        console=as_log(logging.getLogger("x1_pretrain.trainer.loop")) if ctx.world.main else log,
        metrics=recorded,
        stop=ctx.stop,
        checkpointer=checkpointer,
        callbacks=callbacks,
        lab_flops_per_token=fpt.lab_6n,
        optimizer_flops_per_step=newton_schulz_flops_per_step(optimizer),
        horizon=_horizon(cfg, resume),
        alert=alert,
        val_token_bytes=_val_token_bytes(tokenizer, log),
    )
    return Built(run, state, resume, tracker, checkpointer, control, sampler, data)


def start_batches(built: Built) -> None:
    """Start the prefetch thread for the steps the loop will run."""
    cfg, run = built.run.cfg, built.run
    built.prefetch = Prefetcher(
        built.data.train,
        built.sampler,
        run.chunks,
        built.state.step,
        cfg.train.total_steps,
        cfg.train.prefetch,
        pin=run.device.type == "cuda",
    )
    run.batches = iter(built.prefetch)
