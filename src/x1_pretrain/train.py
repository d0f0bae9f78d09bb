"""Pretrain the model: ``python -m x1_pretrain.train --config configs/x1-50m-a100.yaml --data-dir ...``

Exit codes: 0 finished · 2 bad usage/config/data · 3 budget stop with checkpoint · 4 budget stop
without checkpoint · 5 diverged (NaN/Inf) · 6 throughput below --min-tokens-per-s · 75 interrupted
(SIGTERM/SIGINT) after a clean checkpoint · 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import EXIT_ABORTED, EXIT_BUDGET_CHECKPOINT, EXIT_DIVERGED, EXIT_UNEXPECTED, EXIT_USAGE, X1Error

# Flags that belong to features not built yet fail loudly instead of being ignored.
_NOT_YET: dict[str, str] = {}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m x1_pretrain.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (configs/x1-50m-a100.yaml, configs/x1-tiny-cpu.yaml)")
    p.add_argument("--data-dir", required=True, help="tokenize_data output: train.bin, val.bin, meta.json")
    p.add_argument("--ckpt-dir", default="checkpoints", help="checkpoints (and the default MLflow store)")
    p.add_argument("--mlflow-uri", default=None,
                   help="file:///path, sqlite:///path.db or http(s)://server (default: sqlite in --ckpt-dir)")
    p.add_argument("--experiment", default="x1-pretraining", help="MLflow experiment name")
    p.add_argument("--run-name", default=None, help="MLflow run name (default: config name + time)")
    p.add_argument("--total-steps", type=int, help="override train.total_steps")
    p.add_argument("--ckpt-every", type=int, help="override train.ckpt_every")
    p.add_argument("--eval-every", type=int, help="override train.eval_every")
    p.add_argument("--log-every", type=int, help="override train.log_every")
    p.add_argument("--seed", type=int, help="override train.seed")
    p.add_argument("--device", help="override train.device (auto, cpu, cuda, cuda:N)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run eagerly")
    p.add_argument("--min-tokens-per-s", type=float, help="exit 6 when warm throughput falls below this")
    p.add_argument("--peak-tflops", type=float, help="device bf16 peak for MFU (default: from the GPU's name)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key, e.g. --set optim.lr=1e-3 (repeatable; applied last)")
    p.add_argument("--resume-from-latest", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--allow-config-change", action="store_true",
                   help="resume even if the config or data differ from the checkpoint's (logged as a tag)")
    b = p.add_argument_group("budget guard (see README: the budget guard)")
    b.add_argument("--budget-cap-usd", type=float, help="hard dollar cap; enables the guard (the lab: 35.0)")
    b.add_argument("--budget-curr-cost-uri", help="budget.json written by the billing sidecar (path, file:// or http)")
    b.add_argument("--budget-alert-usd", type=float, default=30.0, help="email + Slack above this spend (default 30)")
    b.add_argument("--budget-check-every-min", type=float, default=30.0, help="minutes between checks (default 30)")
    b.add_argument("--budget-sidecar-interval-min", type=float, default=5.0,
                   help="the sidecar's polling interval; a reading older than 3 intervals is stale (default 5)")
    b.add_argument("--budget-unknown-grace-min", type=float, default=60.0,
                   help="stop with a checkpoint when the spend has been unknown this long (default 60)")
    b.add_argument("--max-rate-usd-per-hr", type=float, default=1.40,
                   help="refuse to launch above this hourly rate (the lab's rule: 1.40)")
    b.add_argument("--force-launch", action="store_true", help="launch despite the gate (logged as a tag)")
    b.add_argument("--expected-step-s", type=float,
                   help="measured seconds per optimizer step, for the planned cost (default: from the GPU's peak)")
    b.add_argument("--assumed-mfu", type=float, default=0.40,
                   help="MFU (honest accounting) assumed for the planned cost when --expected-step-s is not given")
    s = p.add_argument_group("loss spikes")
    s.add_argument("--inject-spike-at-step", type=int, metavar="N",
                   help="steps N..N+K-1 train on rare-token batches (skipped if a natural spike comes first)")
    s.add_argument("--spike-batches", type=int, default=5, metavar="K", help="injected steps (default 5)")
    s.add_argument("--force-inject", action="store_true", help="inject even after a natural spike")
    s.add_argument("--skip-spike-steps", dest="skip_spike_steps", action="store_true", default=None,
                   help="skip the optimizer update of a detected spike (sets spike.skip_spike_steps)")
    b.add_argument("--dry-run-budget", action="store_true",
                   help="check the budget source, plan, gate and alert channels (sends a test alert), then exit")
    return p


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "train.total_steps": args.total_steps, "train.ckpt_every": args.ckpt_every,
        "train.eval_every": args.eval_every, "train.log_every": args.log_every, "train.seed": args.seed,
        "train.device": args.device, "train.compile": args.compile, "train.min_tokens_per_s": args.min_tokens_per_s,
        "spike.skip_spike_steps": args.skip_spike_steps,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str, local_rank: int = 0, world_size: int = 1) -> Any:
    """The device of this process; under torchrun on GPUs, the GPU of its local rank."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" or (world_size > 1 and name.startswith("cuda")):
        name = f"cuda:{local_rank}"  # each rank its own GPU; set_device needs an index
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise X1Error(f"train.device {name!r}: no CUDA device is visible (torch {torch.__version__}, "
                      f"CUDA build {torch.version.cuda}); use --device cpu or check nvidia-smi")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def hardware_plan(cfg: Any, device: Any, log: Any) -> bool:
    """Check precision/attention against the device; returns whether flash-attn will be used."""
    import torch

    from .model import flash_available

    # Ampere (compute capability 8.0) or newer: is_bf16_supported() also counts emulated bf16 on older GPUs,
    # and flash-attn 2 refuses them at the first forward.
    ampere = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)
    if cfg.train.precision == "bf16" and device.type == "cuda" and not ampere:
        raise X1Error(f"train.precision 'bf16': {torch.cuda.get_device_name(device)} has no bf16 support; "
                      "use --set train.precision=fp32 (slower) or an Ampere-or-newer GPU")
    if cfg.train.attention != "flash":
        return False
    if device.type != "cuda":
        log("warning: train.attention 'flash' needs a CUDA device; using PyTorch SDPA on the CPU")
        return False
    if not ampere:
        log(f"warning: flash-attn needs an Ampere-or-newer GPU ({torch.cuda.get_device_name(device)} is older); "
            "using PyTorch SDPA")
        return False
    if not flash_available():
        log("warning: flash-attn is not importable (pip install flash-attn==2.6.3 --no-build-isolation, or use "
            "nvcr.io/nvidia/pytorch:24.10-py3); falling back to PyTorch SDPA")
        return False
    if cfg.train.precision != "bf16":
        log("warning: flash-attn needs bf16/fp16 tensors; with train.precision fp32 attention uses SDPA")
        return False
    return True


class _CompileFallback:
    """Calls the compiled model; if compilation fails, warns once and carries on eagerly."""

    def __init__(self, compiled: Any, eager: Any, log: Any) -> None:
        self.compiled, self.eager, self.log = compiled, eager, log
        self.failed = False

    def __call__(self, *a: Any, **k: Any) -> Any:
        if self.failed:
            return self.eager(*a, **k)
        try:
            return self.compiled(*a, **k)
        except Exception as e:  # torch._dynamo / inductor raise many types
            if "out of memory" in str(e).lower():
                raise
            self.failed = True
            self.log(f"warning: torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                     "continuing eagerly (set --no-compile to skip compilation)")
            return self.eager(*a, **k)

    def train(self, mode: bool = True) -> Any:
        return self.eager.train(mode)

    def eval(self) -> Any:
        return self.eager.eval()


def build_optimizer(model: Any, cfg: Any, device: Any) -> Any:
    import torch

    emb = model.model.embed_tokens.weight
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # the tied embedding appears once
        if p.dim() >= 2 and (p is not emb or cfg.optim.decay_embedding):
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kwargs: dict[str, Any] = {"lr": cfg.optim.lr, "betas": (cfg.optim.beta1, cfg.optim.beta2), "eps": cfg.optim.eps}
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


def budget_limits(args: argparse.Namespace) -> Any:
    """The guard's limits from the flags, or None when no cap is set. Bad combinations are usage errors."""
    from .budget_guard import Limits

    if args.budget_cap_usd is None:
        if args.dry_run_budget:
            raise X1Error("--dry-run-budget needs --budget-cap-usd and --budget-curr-cost-uri")
        return None
    problems = []
    if args.budget_cap_usd <= 0:
        problems.append(f"--budget-cap-usd {args.budget_cap_usd} must be positive")
    if not 0 <= args.budget_alert_usd < args.budget_cap_usd:
        problems.append(f"--budget-alert-usd {args.budget_alert_usd} must be below --budget-cap-usd "
                        f"{args.budget_cap_usd}")
    if not args.budget_curr_cost_uri:
        problems.append("--budget-cap-usd needs --budget-curr-cost-uri (the budget.json the sidecar writes: "
                        "python -m x1_pretrain.budget_sidecar --out budget.json ...)")
    for flag in ("budget_check_every_min", "budget_sidecar_interval_min", "budget_unknown_grace_min"):
        if getattr(args, flag) <= 0:
            problems.append(f"--{flag.replace('_', '-')} must be positive")
    if problems:
        raise X1Error("; ".join(problems))
    return Limits(args.budget_cap_usd, args.budget_alert_usd, args.budget_sidecar_interval_min, 3.0,
                  args.budget_unknown_grace_min)


def install_signal_handlers(stop: Any) -> Callable[[], None]:
    """SIGTERM/SIGINT: finish the step, checkpoint, exit 75. A second SIGINT aborts at once.
    SIGUSR1: checkpoint after the current step and keep training. Handlers only set flags.
    Returns a function that puts the previous handlers back."""
    import signal

    names = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    previous = {s: signal.getsignal(s) for s in names}

    def on_stop(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and stop.requested is not None:
            raise KeyboardInterrupt
        if stop.requested is None:
            stop.requested = signal.Signals(signum).name
            stop.requested_at = time.monotonic()

    def on_usr1(_signum: int, _frame: Any) -> None:
        stop.checkpoint_now = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    if hasattr(signal, "SIGUSR1"):
        signal.signal(signal.SIGUSR1, on_usr1)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    return restore


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def log(msg: str) -> None:
        print(f"[x1] {msg}", flush=True)

    for flag, owner in _NOT_YET.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False):
            print(f"error: {flag} is not available yet ({owner}); remove it to train without it", file=sys.stderr)
            return EXIT_USAGE
    try:
        code, reason = _train(args, log), "see the log"
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        code, reason = e.exit_code, str(e).splitlines()[0]
    except KeyboardInterrupt:
        print("aborted by a second SIGINT: no checkpoint written for the current step", file=sys.stderr)
        code, reason = EXIT_ABORTED, "aborted by a second SIGINT"
    if os.environ.get("RANK", "0") == "0" and not args.dry_run_budget:
        from .checkpoint import write_exit_status

        try:
            write_exit_status(Path(args.ckpt_dir), code, reason)
        except OSError as e:
            print(f"warning: could not record the exit status in {args.ckpt_dir} ({e})", file=sys.stderr)
    return code


class ProgressFile:
    """Keeps ``progress.json`` in the checkpoint dir current for the watchdog (a StepHook)."""

    def __init__(self, ckpt_dir: Path, started: float, checkpointer: Any) -> None:
        self.dir, self.started, self.ckpt = ckpt_dir, started, checkpointer
        self.first_step_started: float | None = None
        self.first_step_s: float | None = None

    def after_step(self, run: Any, state: Any, metrics: dict[str, float]) -> None:
        from .checkpoint import write_progress

        now = time.time()
        first = self.first_step_started is None
        if first:
            self.first_step_started = now - state.last_step_s
            self.first_step_s = state.last_step_s
        if first or state.step % run.cfg.train.log_every == 0:
            write_progress(self.dir, {
                "pid": os.getpid(), "step": state.step, "time_unix": now, "started_unix": self.started,
                "first_step_started_unix": self.first_step_started, "first_step_s": self.first_step_s,
                "last_checkpoint_step": self.ckpt.last_saved_step,
                "total_steps": run.cfg.train.total_steps,
            })
        return None


def _check_resume_compatible(found: Any, cfg: Any, data: Any, allow: bool, log: Any) -> list[str]:
    """Differences between the checkpoint's run and this one; raises unless --allow-config-change."""
    from . import config as C

    saved = found.state
    changes: list[str] = []
    for key, old, new in C.diff(saved.get("config", {}), cfg.to_dict()):
        if key in C.OPERATIONAL_KEYS:
            log(f"note: {key} changed from {old!r} to {new!r} since the checkpoint (operational; allowed)")
        else:
            changes.append(f"{key}: {old!r} -> {new!r}")
    if saved.get("data_identity") != data.identity:
        changes.append(f"data: {data.directory}/meta.json describes other tokens than the run was trained on "
                       f"(trained on {saved.get('data_dir')})")
    if changes and not allow:
        lines = "\n".join(f"    {c}" for c in changes)
        raise X1Error(f"{found.path} was written with another configuration or data:\n{lines}\n"
                      "  hint: pass --allow-config-change to resume anyway (it is logged), or use the original "
                      "config and data")
    for c in changes:
        log(f"warning: resuming with a change ({c}) because --allow-config-change was given")
    return changes


def _train(args: argparse.Namespace, log: Any) -> int:
    from . import config as C
    from . import distributed

    started_unix = time.time()
    world = distributed.world_from_env()
    cfg = C.load(args.config, _flag_overrides(args), args.set, world_size=world.size)
    if not world.main:  # ranks other than 0 train quietly; errors still reach stderr
        log = _quiet
    elif world.size > 1:
        log(f"data parallel over {world.size} ranks: global batch {cfg.train.batch_size} = micro-batch "
            f"{cfg.train.micro_batch_size} x grad accumulation {cfg.train.grad_accum_steps} x {world.size} ranks")
    import numpy as np  # noqa: F401  (imported before torch on purpose: fail fast on a broken env)

    from . import alerts, flops
    from . import budget_run as br
    from . import checkpoint as ck
    from .budget_guard import read_source
    from .env import device_name
    from .loop import StopFlag

    limits = budget_limits(args)
    if args.inject_spike_at_step is not None and (args.inject_spike_at_step < 1 or args.spike_batches < 1):
        raise X1Error(f"--inject-spike-at-step {args.inject_spike_at_step} and --spike-batches {args.spike_batches} "
                      "must be at least 1")
    device = resolve_device(cfg.train.device, world.local_rank, world.size)
    ckpt_dir = Path(args.ckpt_dir)
    fpt = flops.flops_per_token(cfg.model)
    dev_name = device_name(device)
    peak = flops.peak_tflops(dev_name if device.type == "cuda" else None, args.peak_tflops)
    if limits is not None:
        latest = ck.read_latest(ckpt_dir) if args.resume_from_latest else None
        done = int(latest.split("_")[1]) if latest and latest.startswith("step_") else 0
        step_s = br.expected_step_s(args.expected_step_s, cfg.tokens_per_step(), fpt.honest, peak, args.assumed_mfu)
        plan = br.Plan(cfg.train.total_steps, done, step_s)
        alerter = alerts.from_env()
        if args.dry_run_budget:
            return br.dry_run(args.budget_curr_cost_uri, limits, plan, args.max_rate_usd_per_hr, alerter, log)
        problems = br.gate_problems(read_source(args.budget_curr_cost_uri), plan, limits, args.max_rate_usd_per_hr)
        if problems and not args.force_launch:
            for problem in problems:
                print(f"error: launch refused: {problem}", file=sys.stderr)
            return EXIT_BUDGET_CHECKPOINT
        for problem in problems:
            log(f"warning: --force-launch given despite: {problem}")
        if step_s is None:
            log("warning: the planned cost cannot be checked (no --expected-step-s and no known GPU peak)")

    stop = StopFlag()
    restore_signals = install_signal_handlers(stop)
    distributed.init(world, device.type)
    try:
        code = _train_with(args, cfg, log, stop, limits, device, ckpt_dir, fpt, dev_name, peak, started_unix,
                           alerter if limits is not None else None, world)
        if world.size > 1:
            # Ranks leave together once rank 0 has written its last checkpoint and its exit status: a rank
            # that left early with a non-zero code would make torchrun signal rank 0 mid-write.
            import torch

            if world.main:
                ck.write_exit_status(ckpt_dir, code, "see the log")
            torch.distributed.barrier()
        return code
    finally:
        restore_signals()
        distributed.shutdown(world)


def _quiet(msg: str) -> None:
    return None


def _train_with(args: argparse.Namespace, cfg: Any, log: Any, stop: Any, limits: Any, device: Any, ckpt_dir: Path,
                fpt: Any, dev_name: str, peak: float | None, started_unix: float, alerter: Any, world: Any) -> int:
    """Everything after the launch gate (signal handlers are installed around this)."""
    import torch

    from . import budget_run as br
    from . import checkpoint as ck
    from . import config as C
    from . import distributed, flops
    from .data import Prefetcher, Sampler, gather, open_token_data, val_starts
    from .env import machine, versions
    from .loop import Diverged, LoopState, Run, train_loop
    from .model import Transformer, state_dict_for_saving
    from .spike import SpikeDetector, SpikeInjector, SpikeSchedule, SpikeWatch, rare_token_distribution, unigram_counts
    from .tracking import MlflowTracker, NullTracker, resolve_uri, run_tags

    use_flash = hardware_plan(cfg, device, log)
    data = open_token_data(args.data_dir, cfg.model.vocab_size, cfg.model.seq_len)
    try:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        uri, artifact_location = resolve_uri(args.mlflow_uri, ckpt_dir)
    except ValueError as e:
        raise X1Error(str(e)) from None
    except OSError as e:
        raise X1Error(f"--ckpt-dir {ckpt_dir} cannot be created or written ({e.strerror}); choose a writable "
                      "directory") from None

    found = None
    if args.resume_from_latest:
        found = ck.find_latest_complete(ckpt_dir, lambda m: log(f"warning: {m}"))
        if found is None:
            log(f"no complete checkpoint in {ckpt_dir} yet: starting fresh")
    elif ck.list_step_dirs(ckpt_dir):
        raise X1Error(f"--ckpt-dir {ckpt_dir} already holds checkpoints ({ck.list_step_dirs(ckpt_dir)[-1][1].name}); "
                      "pass --resume-from-latest to continue that run, or choose an empty --ckpt-dir")
    changes = _check_resume_compatible(found, cfg, data, args.allow_config_change, log) if found else []

    seed_everything(cfg.train.seed)
    model = Transformer(cfg.model).to(device)
    model.set_attention(use_flash)
    optimizer = build_optimizer(model, cfg, device)
    state = LoopState()
    run_id = None
    if found is not None:
        ck.load_model_state(model, {k: v.to(device) for k, v in ck.load_weights(found.path).items()}, found.path)
        try:
            optimizer.load_state_dict(ck.load_optimizer(found.path))
        except ValueError as e:
            raise X1Error(f"{found.path}: the optimizer state does not fit this run's parameter groups ({e}); "
                          "optim.decay_embedding or the model changed since the checkpoint") from None
        ck.restore_rng(found.state["rng"])
        s = found.state
        state = LoopState(step=s["step"], tokens_seen=s["tokens_seen"], train_time_s=s["train_time_s"],
                          last_loss=s.get("last_loss", math.nan), last_val_loss=s.get("last_val_loss", math.nan))
        run_id = s.get("mlflow_run_id")
        if s.get("mlflow_uri") not in (None, uri):
            log(f"warning: the checkpoint's MLflow store was {s.get('mlflow_uri')}; logging to {uri} now")
        log(f"resuming from {found.path} at step {state.step} ({state.tokens_seen:,} tokens seen)")

    log(f"config {args.config} sha256 {cfg.sha256()[:12]} | device {dev_name} | "
        f"attention {'flash-attn' if use_flash else 'SDPA'} | precision {cfg.train.precision}")
    for line in flops.describe(cfg.model, dev_name if device.type == "cuda" else None, args.peak_tflops).splitlines():
        log(line)

    ddp = None
    if world.size > 1:
        # broadcast_buffers off: the only buffers are the RoPE tables, the same on every rank. (Newer torch
        # renames the flag with a FutureWarning; the old name is the one torch 2.5 knows.)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False)
    forward: Any = ddp if ddp is not None else model
    if cfg.train.compile:
        log(f"torch.compile mode={cfg.train.compile_mode} (first step includes compilation)")
        forward = _CompileFallback(torch.compile(forward, mode=cfg.train.compile_mode), forward, log)

    chunks_per_step = cfg.train.batch_size // cfg.train.micro_batch_size
    sampler = Sampler(data.train.size, cfg.model.seq_len, cfg.train.seed, cfg.train.micro_batch_size, chunks_per_step)
    starts = val_starts(data.val.size, cfg.model.seq_len, cfg.train.eval_batches * cfg.train.micro_batch_size)
    val_batches = [gather(data.val, starts[i:i + cfg.train.micro_batch_size], cfg.model.seq_len)
                   for i in range(0, len(starts), cfg.train.micro_batch_size)]
    log(f"data {data.directory}: {data.train.size:,} train tokens ({sampler.n_windows:,} windows), "
        f"{data.val.size:,} val tokens ({len(starts)} fixed eval windows); "
        f"{cfg.train.total_steps} steps = {sampler.epoch_of(cfg.train.total_steps):.2f} epochs")

    run_name = args.run_name or f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker: Any = MlflowTracker(uri, artifact_location, run_name, run_id=run_id, experiment=args.experiment) \
        if world.main else NullTracker()
    restarts = int(os.environ.get("X1_RESTART_COUNT", "0") or 0)
    if found is None:
        tracker.log_params({**C.flatten(cfg.to_dict()), "config_sha256": cfg.sha256(), "seed": cfg.train.seed,
                            "world_size": world.size, "data_dir": str(data.directory),
                            "tokens_per_step": cfg.tokens_per_step(),
                            **{f"version.{k}": v for k, v in versions().items()}})
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        cfg_file = ckpt_dir / f".resolved-config-{os.getpid()}.yaml"
        cfg_file.write_text(f"# sha256 {cfg.sha256()}\n" + C.to_yaml(cfg))
        tracker.log_artifact(cfg_file, "config")
        cfg_file.unlink(missing_ok=True)
    tags: dict[str, Any] = {**run_tags(dev_name), "config_file": str(args.config), "restarts": restarts}
    if limits is not None:
        tags.update({"budget_cap_usd": limits.cap_usd, "budget_alert_usd": limits.alert_usd,
                     "budget_source": args.budget_curr_cost_uri})
        if args.force_launch:
            tags["force_launch"] = "true"
    if changes:
        tags["config_changed_on_resume"] = "; ".join(changes)[:4000]
    tracker.set_tags(tags)
    if found is not None:
        tracker.log_metrics(state.step, {"run/restarts": float(restarts)})
    log(f"MLflow: {uri} run {tracker.run_id or '(pending: server unreachable)'}"
        + (" (continued)" if found is not None else ""))

    machine_info = machine()

    def trainer_state(run: Any, st: Any) -> dict[str, Any]:
        return {
            "step": st.step, "tokens_seen": st.tokens_seen, "train_time_s": st.train_time_s,
            "wall_clock_s": time.time() - started_unix + (found.state.get("wall_clock_s", 0.0) if found else 0.0),
            "last_loss": st.last_loss, "last_val_loss": st.last_val_loss,
            "rng": ck.rng_state(),
            "data_position": {"next_step": st.step, "seed": cfg.train.seed, "chunks_per_step": chunks_per_step,
                              "micro_batch_size": cfg.train.micro_batch_size,
                              "epoch": sampler.epoch_of(st.step)},
            "data_dir": str(data.directory), "data_identity": data.identity,
            "config_sha256": cfg.sha256(), "config": cfg.to_dict(),
            "mlflow_uri": uri, "mlflow_run_id": tracker.run_id, "restarts": restarts,
            "budget": monitor.snapshot_json() if monitor is not None else None,
            "spike": spike_watch.state(),
            "versions": versions(), "world_size": world.size, "machine": machine_info,
            "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def on_saved(step: int, path: Path, secs: float, size: int) -> None:
        tracker.log_metrics(step, {"checkpoint/save_s": secs, "checkpoint/mb_per_s": size / 1e6 / max(secs, 1e-9),
                                   "checkpoint/size_mb": size / 1e6})

    def before_save() -> None:
        # Every metric up to a checkpoint is in the store before the checkpoint exists: a process killed
        # later loses only metrics of steps that its resumed successor replays and logs again.
        if tracker.reachable:
            tracker.flush(timeout_s=10.0)

    def on_final(path: Path, hashes: dict[str, str]) -> None:
        tracker.set_tags({"final_checkpoint": str(path.resolve()),
                          "final_safetensors": str((ckpt_dir / ck.FINAL_MODEL).resolve()),
                          "final_safetensors_sha256": hashes[ck.FINAL_MODEL]})

    injector = None
    if args.inject_spike_at_step is not None:
        counts = unigram_counts(data.directory, data.train, cfg.model.vocab_size, cache_dir=ckpt_dir, log=log)
        ids, probs = rare_token_distribution(counts, data.meta.get("eot_id"))
        injector = SpikeInjector(SpikeSchedule(args.inject_spike_at_step, args.spike_batches), ids, probs,
                                 cfg.train.seed)
        last = args.inject_spike_at_step + args.spike_batches - 1
        tracker.set_tags({"spike_injection": f"steps {args.inject_spike_at_step}..{last} "
                          f"(--inject-spike-at-step {args.inject_spike_at_step} --spike-batches {args.spike_batches})",
                          "spike_inject_at_step": args.inject_spike_at_step, "spike_batches": args.spike_batches})
        log(f"spike injection planned: steps {args.inject_spike_at_step}..{last} on rare-token batches "
            f"({len(ids)} rarest token types of the train split)")
    sc = cfg.spike
    spike_watch = SpikeWatch(SpikeDetector(sc.ema_alpha, sc.warmup_steps, sc.loss_sigma, sc.min_loss_jump,
                                           sc.grad_factor, sc.grad_window),
                             injector, sc.skip_spike_steps, args.force_inject, log, tracker.log_metrics,
                             tracker.set_tags)
    if found is not None and found.state.get("spike"):
        spike_watch.load_state(found.state["spike"])

    monitor = None
    if limits is not None and world.main:
        def send_alert(subject: str, body: str) -> None:
            alerter.send(subject, body)

        monitor = br.BudgetMonitor(args.budget_curr_cost_uri, limits, args.budget_check_every_min * 60,
                                   send_alert=send_alert, log=log, metrics=tracker.log_metrics)

    checkpointer = ck.Checkpointer(ckpt_dir, cfg.checkpoint.keep_last, cfg.checkpoint.async_save,
                                   state_dict_for_saving, trainer_state, log, on_saved, on_final, before_save) \
        if world.main else None
    if found is not None and checkpointer is not None:
        checkpointer.last_saved_step = found.step
    hooks: list[Any] = [spike_watch]
    if checkpointer is not None:
        hooks.insert(0, ProgressFile(ckpt_dir, started_unix, checkpointer))
    first_code = 0
    if monitor is not None:
        hooks.append(monitor)
        first = br.outcome_of(monitor.check(state.step, cfg.train.total_steps, 0.0), state.step)
        if first is not None:
            first_code = first[0].exit_code
            log(f"{first[0].reason} (before training; exit {first_code})")
    if limits is not None:  # every rank learns rank 0's verdict, or the others would wait for it forever
        (first_code,) = distributed.agree_max([first_code], world, device)
    if first_code:  # stop before training: nothing new to checkpoint
        status = "KILLED"
        if first_code == EXIT_BUDGET_CHECKPOINT and found is not None and world.main:
            on_final(found.path, ck.write_final_files(ckpt_dir, found.path))  # the run ends at its last checkpoint
            status = "FINISHED"
        tracker.close(status, spill_dir=ckpt_dir)
        return first_code
    my_chunks = world.chunks(cfg.train.grad_accum_steps)
    prefetch = Prefetcher(data.train, sampler, my_chunks, state.step, cfg.train.total_steps,
                          cfg.train.prefetch, pin=device.type == "cuda")
    run = Run(cfg=cfg, model=forward, raw_model=model, optimizer=optimizer, device=device, batches=iter(prefetch),
              chunks=my_chunks, val_batches=val_batches, flops_per_token=fpt.honest, world=world, ddp=ddp,
              peak_tflops=peak, tracker=tracker, console=log, stop=stop, checkpointer=checkpointer,
              hooks=hooks, lab_flops_per_token=fpt.lab_6n, batch_source=injector, spike_watch=spike_watch)
    status = "FAILED"
    try:
        outcome = train_loop(run, state)
        # A budget stop with a checkpoint is a planned end of the run (and what export_run exports).
        status = "FINISHED" if outcome.exit_code in (0, EXIT_BUDGET_CHECKPOINT) else "KILLED"
        tracker.set_tags({"end_reason": outcome.reason[:4000], "exit_code": outcome.exit_code})
        log(f"{outcome.reason} at step {outcome.step}: exit {outcome.exit_code}")
        return outcome.exit_code
    except Diverged as e:
        tracker.set_tags({"diverged_at_step": e.step})
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
        prefetch.close()
        try:
            if checkpointer is not None:
                checkpointer.wait()
        finally:
            tracker.close(status, spill_dir=ckpt_dir)


if __name__ == "__main__":
    raise SystemExit(main())
