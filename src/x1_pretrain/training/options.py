"""The trainer's flags (``python -m x1_pretrain.train --help``) and the options they become.

Flags that set config keys (``--total-steps`` …) become overrides applied after the YAML file and before
``--set``; the rest are grouped by what they steer: paths and resume, the budget guard, spike injection.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..budget.money import DEFAULT_MFU, DEFAULT_RESERVE_MIN
from ..core.errors import exit_code_help
from ..core.names import EXPERIMENT

DESCRIPTION = """Pretrain the model: python -m x1_pretrain.train --config configs/x1-50m-a100.yaml --data-dir ...

""" + exit_code_help()


@dataclass(frozen=True, kw_only=True)
class BudgetOptions:
    """The budget guard's flags; ``cap_usd`` None means no guard. Keyword-only: fields share types, so a swap
    of two positional floats would run silently."""

    cap_usd: float | None = None
    source: str | None = None              # --budget-curr-cost-uri
    alert_usd: float = 30.0
    check_every_min: float = 30.0
    sidecar_interval_min: float = 5.0
    unknown_grace_min: float = 60.0
    max_rate_usd_per_hr: float = 1.40
    force_launch: bool = False
    expected_step_s: float | None = None
    assumed_mfu: float = DEFAULT_MFU
    dry_run: bool = False
    stop_wait_s: float = 120.0             # projected over the cap: the longest wait for a step boundary
    reserve_min: float = DEFAULT_RESERVE_MIN
    buffer_usd: float = 5.0
    max_hours: float | None = None         # --fit-to-budget: the run's wall-clock window (hours since it began)


@dataclass(frozen=True)
class SpikeOptions:
    inject_at_step: int | None = None
    batches: int = 5
    force_inject: bool = False


@dataclass(frozen=True)
class TrainOptions:
    config: str
    data_dir: str
    ckpt_dir: Path = Path("checkpoints")
    mlflow_uri: str | None = None
    experiment: str = EXPERIMENT
    run_name: str | None = None
    resume: bool = False
    allow_config_change: bool = False
    peak_tflops: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)   # config keys set by flags
    sets: tuple[str, ...] = ()                                 # --set section.key=value, applied last
    budget: BudgetOptions = BudgetOptions()
    spike: SpikeOptions = SpikeOptions()
    stop_grace_s: float = 25.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m x1_pretrain.train", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (configs/x1-50m-a100.yaml, configs/x1-tiny-cpu.yaml)")
    p.add_argument("--data-dir", required=True, help="tokenize_data output: train.bin, val.bin, meta.json")
    p.add_argument("--ckpt-dir", default="checkpoints", help="checkpoints (and the default MLflow store)")
    p.add_argument("--mlflow-uri", default=None,
                   help="file:///path, sqlite:///path.db or http(s)://server (default: sqlite in --ckpt-dir)")
    p.add_argument("--experiment", default=EXPERIMENT, help="MLflow experiment name")
    p.add_argument("--run-name", default=None, help="MLflow run name (default: config name + time)")
    p.add_argument("--total-steps", type=int, help="override train.total_steps")
    p.add_argument("--ckpt-every", type=int, help="override train.ckpt_every")
    p.add_argument("--eval-every", type=int, help="override train.eval_every")
    p.add_argument("--log-every", type=int, help="override train.log_every")
    p.add_argument("--seed", type=int, help="override train.seed")
    p.add_argument("--device", help="override train.device (auto, cpu, cuda, cuda:N)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run eagerly")
    p.add_argument("--ckpt-every-min", type=float,
                   help="also checkpoint when this many minutes passed since the last one (override "
                        "train.ckpt_every_min; the runbook uses 15)")
    p.add_argument("--min-tokens-per-s", type=float,
                   help="exit 6 when warm throughput falls below this during the first hour (the lab's check)")
    p.add_argument("--min-tokens-per-s-window", type=float, metavar="MIN",
                   help="minutes of training the floor ends the run in (default 60; later drops are logged and "
                        "alerted; sets train.min_tokens_per_s_window_min)")
    p.add_argument("--min-tokens-per-s-always", dest="min_tokens_per_s_always", action="store_true", default=None,
                   help="the floor ends the run at any time, not only in its window")
    p.add_argument("--stop-grace-s", type=float, default=25.0,
                   help="SIGTERM/SIGHUP to exit in at most this many seconds: the checkpoint first, then MLflow "
                        "with what is left (default 25; GCP gives 30 s, AWS 120 s)")
    p.add_argument("--peak-tflops", type=float, help="device bf16 peak for MFU (default: from the GPU's name)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key, e.g. --set optim.lr=1e-3 (repeatable; applied last)")
    p.add_argument("--resume-from-latest", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument("--allow-config-change", action="store_true",
                   help="resume even if the config or data differ from the checkpoint's (logged as a tag)")
    _budget_flags(p.add_argument_group("budget guard (see docs/budget.md)"))
    s = p.add_argument_group("loss spikes")
    s.add_argument("--inject-spike-at-step", type=int, metavar="N",
                   help="steps N..N+K-1 train on rare-token batches (skipped if a natural spike comes first)")
    s.add_argument("--spike-batches", type=int, default=5, metavar="K", help="injected steps (default 5)")
    s.add_argument("--force-inject", action="store_true", help="inject even after a natural spike")
    s.add_argument("--skip-spike-steps", dest="skip_spike_steps", action="store_true", default=None,
                   help="skip the optimizer update of a detected spike (sets spike.skip_spike_steps)")
    return p


def _budget_flags(b: Any) -> None:
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
    b.add_argument("--assumed-mfu", type=float, default=DEFAULT_MFU,
                   help="MFU (honest accounting) assumed for the planned cost when --expected-step-s is not given "
                        f"(default {DEFAULT_MFU}, as plan)")
    b.add_argument("--budget-reserve-min", type=float, default=DEFAULT_RESERVE_MIN,
                   help="minutes billed after the last step (final checkpoint, export, shutdown), counted in every "
                        f"projection (default {DEFAULT_RESERVE_MIN:g})")
    b.add_argument("--budget-buffer-usd", type=float, default=5.0,
                   help="dollars the launch gate keeps aside for one restart, as plan does (default 5)")
    b.add_argument("--fit-to-budget", dest="fit_to_budget", action="store_true", default=None,
                   help="--total-steps becomes an upper bound: at every check the end moves to what the money (and "
                        "--max-hours) still pays for, and the wsd decay reaches min_lr exactly there (sets "
                        "train.fit_to_budget; needs optim.schedule wsd)")
    b.add_argument("--max-hours", type=float, help="with --fit-to-budget: hours of wall clock the run may take, "
                   "from its first start (downtime included; kept in the budget ledger)")
    b.add_argument("--budget-stop-wait-s", type=float, default=120.0,
                   help="projected over the cap: wait this long for a step boundary to checkpoint at, then exit 4 "
                        "without one (default 120)")
    b.add_argument("--dry-run-budget", action="store_true",
                   help="check the budget source, plan, gate and alert channels (sends a test alert), then exit")


def options_from(args: argparse.Namespace) -> TrainOptions:
    pairs = {
        "train.total_steps": args.total_steps, "train.ckpt_every": args.ckpt_every,
        "train.eval_every": args.eval_every, "train.log_every": args.log_every, "train.seed": args.seed,
        "train.device": args.device, "train.compile": args.compile, "train.min_tokens_per_s": args.min_tokens_per_s,
        "train.ckpt_every_min": args.ckpt_every_min, "train.min_tokens_per_s_window_min": args.min_tokens_per_s_window,
        "train.min_tokens_per_s_always": args.min_tokens_per_s_always,
        "spike.skip_spike_steps": args.skip_spike_steps, "train.fit_to_budget": args.fit_to_budget,
    }
    budget = BudgetOptions(
        cap_usd=args.budget_cap_usd, source=args.budget_curr_cost_uri, alert_usd=args.budget_alert_usd,
        check_every_min=args.budget_check_every_min, sidecar_interval_min=args.budget_sidecar_interval_min,
        unknown_grace_min=args.budget_unknown_grace_min, max_rate_usd_per_hr=args.max_rate_usd_per_hr,
        force_launch=args.force_launch, expected_step_s=args.expected_step_s, assumed_mfu=args.assumed_mfu,
        dry_run=args.dry_run_budget, stop_wait_s=args.budget_stop_wait_s, reserve_min=args.budget_reserve_min,
        buffer_usd=args.budget_buffer_usd, max_hours=args.max_hours)
    return TrainOptions(
        config=args.config, data_dir=args.data_dir, ckpt_dir=Path(args.ckpt_dir), mlflow_uri=args.mlflow_uri,
        experiment=args.experiment, run_name=args.run_name, resume=args.resume_from_latest,
        allow_config_change=args.allow_config_change, peak_tflops=args.peak_tflops,
        overrides={k: v for k, v in pairs.items() if v is not None}, sets=tuple(args.set), budget=budget,
        spike=SpikeOptions(args.inject_spike_at_step, args.spike_batches, args.force_inject),
        stop_grace_s=args.stop_grace_s)
