"""Pretrain the model: ``python -m x1_pretrain.train --config configs/x1-50m-a100.yaml --data-dir ...``

Exit codes: 0 finished · 2 bad usage/config/data · 3 budget stop with checkpoint · 4 budget stop
without checkpoint · 5 diverged (NaN/Inf) · 6 throughput below --min-tokens-per-s · 75 interrupted
(SIGTERM/SIGINT) after a clean checkpoint · 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .errors import EXIT_DIVERGED, EXIT_UNEXPECTED, EXIT_USAGE, X1Error

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
    p.add_argument("--budget-cap-usd", type=float, help="hard dollar cap (budget guard)")
    p.add_argument("--budget-curr-cost-uri", help="budget.json written by the billing sidecar")
    p.add_argument("--inject-spike-at-step", type=int, help="train on rare-token batches from step N")
    p.add_argument("--dry-run-budget", action="store_true", help="check the budget set-up and exit")
    return p


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    pairs = {
        "train.total_steps": args.total_steps, "train.ckpt_every": args.ckpt_every,
        "train.eval_every": args.eval_every, "train.log_every": args.log_every, "train.seed": args.seed,
        "train.device": args.device, "train.compile": args.compile, "train.min_tokens_per_s": args.min_tokens_per_s,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise X1Error(f"train.device {name!r}: no CUDA device is visible (torch {torch.__version__}, "
                      f"CUDA build {torch.version.cuda}); use --device cpu or check nvidia-smi")
    return dev


def hardware_plan(cfg: Any, device: Any, log: Any) -> bool:
    """Check precision/attention against the device; returns whether flash-attn will be used."""
    import torch

    from .model import flash_available

    if cfg.train.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise X1Error(f"train.precision 'bf16': {torch.cuda.get_device_name(device)} has no bf16 support; "
                      "use --set train.precision=fp32 (slower) or an Ampere-or-newer GPU")
    if cfg.train.attention != "flash":
        return False
    if device.type != "cuda":
        log("warning: train.attention 'flash' needs a CUDA device; using PyTorch SDPA on the CPU")
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def log(msg: str) -> None:
        print(f"[x1] {msg}", flush=True)

    for flag, owner in _NOT_YET.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False):
            print(f"error: {flag} is not available yet ({owner}); remove it to train without it", file=sys.stderr)
            return EXIT_USAGE
    try:
        return _train(args, log)
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def _train(args: argparse.Namespace, log: Any) -> int:
    from . import config as C

    cfg = C.load(args.config, _flag_overrides(args), args.set)
    import numpy as np  # noqa: F401  (imported before torch on purpose: fail fast on a broken env)
    import torch

    from . import flops
    from .data import Prefetcher, Sampler, gather, open_token_data, val_starts
    from .env import device_name, versions
    from .loop import Diverged, LoopState, Run, train_loop
    from .model import Transformer
    from .tracking import MlflowTracker, resolve_uri, run_tags

    device = resolve_device(cfg.train.device)
    use_flash = hardware_plan(cfg, device, log)
    data = open_token_data(args.data_dir, cfg.model.vocab_size, cfg.model.seq_len)
    ckpt_dir = Path(args.ckpt_dir)
    try:
        uri, artifact_location = resolve_uri(args.mlflow_uri, ckpt_dir)
    except ValueError as e:
        raise X1Error(str(e)) from None

    seed_everything(cfg.train.seed)
    model = Transformer(cfg.model).to(device)
    model.set_attention(use_flash)
    optimizer = build_optimizer(model, cfg, device)
    state = LoopState()
    dev_name = device_name(device)
    peak = flops.peak_tflops(dev_name if device.type == "cuda" else None, args.peak_tflops)
    fpt = flops.flops_per_token(cfg.model)
    log(f"config {args.config} sha256 {cfg.sha256()[:12]} | device {dev_name} | "
        f"attention {'flash-attn' if use_flash else 'SDPA'} | precision {cfg.train.precision}")
    for line in flops.describe(cfg.model, dev_name if device.type == "cuda" else None, args.peak_tflops).splitlines():
        log(line)

    forward: Any = model
    if cfg.train.compile:
        log(f"torch.compile mode={cfg.train.compile_mode} (first step includes compilation)")
        forward = _CompileFallback(torch.compile(model, mode=cfg.train.compile_mode), model, log)

    chunks_per_step = cfg.train.batch_size // cfg.train.micro_batch_size
    sampler = Sampler(data.train.size, cfg.model.seq_len, cfg.train.seed, cfg.train.micro_batch_size, chunks_per_step)
    starts = val_starts(data.val.size, cfg.model.seq_len, cfg.train.eval_batches * cfg.train.micro_batch_size)
    val_batches = [gather(data.val, starts[i:i + cfg.train.micro_batch_size], cfg.model.seq_len)
                   for i in range(0, len(starts), cfg.train.micro_batch_size)]
    log(f"data {data.directory}: {data.train.size:,} train tokens ({sampler.n_windows:,} windows), "
        f"{data.val.size:,} val tokens ({len(starts)} fixed eval windows); "
        f"{cfg.train.total_steps} steps = {sampler.epoch_of(cfg.train.total_steps):.2f} epochs")

    run_name = args.run_name or f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker = MlflowTracker(uri, artifact_location, run_name, run_id=None, experiment=args.experiment)
    resolved = C.flatten(cfg.to_dict())
    tracker.log_params({**resolved, "config_sha256": cfg.sha256(), "seed": cfg.train.seed, "world_size": 1,
                        "data_dir": str(data.directory), "tokens_per_step": cfg.tokens_per_step(),
                        **{f"version.{k}": v for k, v in versions().items()}})
    tracker.set_tags({**run_tags(dev_name), "config_file": str(args.config)})
    cfg_file = ckpt_dir / f".resolved-config-{os.getpid()}.yaml"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(f"# sha256 {cfg.sha256()}\n" + C.to_yaml(cfg))
    tracker.log_artifact(cfg_file, "config")
    cfg_file.unlink(missing_ok=True)
    log(f"MLflow: {uri} run {tracker.run_id or '(pending: server unreachable)'}")

    prefetch = Prefetcher(data.train, sampler, list(range(chunks_per_step)), state.step, cfg.train.total_steps,
                          cfg.train.prefetch, pin=device.type == "cuda")
    run = Run(cfg=cfg, model=forward, raw_model=model, optimizer=optimizer, device=device, batches=iter(prefetch),
              chunks=list(range(chunks_per_step)), val_batches=val_batches, flops_per_token=fpt.honest,
              peak_tflops=peak, tracker=tracker, console=log, lab_flops_per_token=fpt.lab_6n)
    status = "FAILED"
    try:
        outcome = train_loop(run, state)
        status = "FINISHED" if outcome.exit_code == 0 else "KILLED"
        log(f"{outcome.reason} at step {outcome.step}: exit {outcome.exit_code}")
        return outcome.exit_code
    except Diverged as e:
        tracker.set_tags({"diverged_at_step": e.step})
        print(f"error: {e}. No checkpoint was written from these weights. Check the data for out-of-range ids "
              "and that fp32 master weights are on (train.precision bf16 keeps them); lower optim.lr if it "
              "persists.", file=sys.stderr)
        return EXIT_DIVERGED
    except X1Error:
        raise
    except Exception:
        traceback.print_exc()
        return EXIT_UNEXPECTED
    finally:
        prefetch.close()
        tracker.close(status)


if __name__ == "__main__":
    raise SystemExit(main())
