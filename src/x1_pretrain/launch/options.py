"""The trainer's flags (``python -m x1_pretrain.train --help``) and the options they become.

Flags that set config keys (``--total-steps`` …) become overrides applied after the YAML file and before
``--set``; the rest are grouped by what they steer: paths and resume, the budget guard, spike injection.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import config as C
from ..core import redact
from ..core.cli import old_spelling
from ..core.contract import exit_code_help
from ..core.log import add_flag as add_log_level
from ..core.names import EXPERIMENT

DESCRIPTION = """Pretrain the model: python -m x1_pretrain.train --config configs/x1-50m-a100.yaml --data-dir ...

""" + exit_code_help()


@dataclass(frozen=True, kw_only=True)
class SpikeOptions:
    inject_at_step: int | None = None
    batches: int = 5
    force_inject: bool = False


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    config: str
    data_dir: str
    ckpt_dir: Path = Path("checkpoints")
    mlflow_uri: str | None = None
    experiment: str = EXPERIMENT
    run_name: str | None = None
    resume: bool = False
    allow_config_change: bool = False
    reset_optimizer: bool = False  # resume without the checkpoint's optimizer state
    peak_tflops: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # config keys set by flags
    sets: tuple[str, ...] = ()  # --set section.key=value, applied last
    spike: SpikeOptions = SpikeOptions()
    stop_grace_s: float = 25.0
    curr_cost_uri: str | None = None  # --budget-curr-cost-uri: the budget.json the sidecar writes (its --out)
    force_launch: bool = False  # launch despite the budget gate
    dry_run_budget: bool = False  # check the budget set-up, then exit


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.train",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument("--config", required=True, help="YAML config (configs/x1-50m-a100.yaml, configs/x1-tiny-cpu.yaml)")
    p.add_argument("--data-dir", required=True, help="tokenize_data output: train.bin, val.bin, meta.json")
    p.add_argument("--ckpt-dir", default="checkpoints", help="checkpoints (and the default MLflow store)")
    p.add_argument(
        "--mlflow-uri",
        default=None,
        help="file:///path, sqlite:///path.db or http(s)://server (default: sqlite in --ckpt-dir); a "
        "server's credentials: MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, not the URL",
    )
    p.add_argument("--experiment", default=EXPERIMENT, help="MLflow experiment name")
    p.add_argument("--run-name", default=None, help="MLflow run name (default: config name + time)")
    p.add_argument("--total-steps", type=int, help="override train.total_steps")
    p.add_argument(
        "--checkpoint-every-steps",
        "--ckpt-every",
        dest="checkpoint_every_steps",
        type=int,
        help="override checkpoint.every_steps (--ckpt-every: the lab's spelling, kept)",
    )
    p.add_argument("--eval-every", type=int, help="override train.eval_every")
    p.add_argument("--log-every", type=int, help="override train.log_every")
    p.add_argument("--seed", type=int, help="override train.seed")
    p.add_argument("--device", help="override train.device (auto, cpu, cuda, cuda:N)")
    p.add_argument("--compile", dest="compile", action="store_true", default=None, help="torch.compile the model")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run eagerly")
    old_spelling(
        p,
        "--ckpt-every-min",
        p.add_argument(
            "--checkpoint-every-min",
            type=float,
            help="also checkpoint when this many minutes passed since the last "
            "one (override checkpoint.every_min; the runbook uses 15; was --ckpt-every-min)",
        ),
    )
    p.add_argument(
        "--ckpt-remote",
        metavar="s3://BUCKET/PREFIX",
        help="mirror every checkpoint, the cost ledger and the MLflow store to an S3-compatible store "
        "(endpoint and keys from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); with "
        "--resume-from-latest an empty --ckpt-dir resumes from it (override checkpoint.remote)",
    )
    p.add_argument(
        "--checkpoint-remote-wait-min",
        type=float,
        metavar="MIN",
        help="--resume-from-latest with nothing local and a --ckpt-remote that cannot be reached: wait "
        "this many minutes for it (backoff up to 60 s between tries), then exit 8, which the "
        "watchdog relaunches (default 30; 0: exit 8 at once; override checkpoint.remote_wait_min)",
    )
    p.add_argument(
        "--min-tokens-per-s",
        type=float,
        help="exit 6 when warm throughput falls below this during the first hour (the lab's check)",
    )
    old_spelling(
        p,
        "--min-tokens-per-s-window",
        p.add_argument(
            "--min-tokens-per-s-window-min",
            type=float,
            metavar="MIN",
            help="minutes of training the floor ends the run in (default 60; later drops are logged and alerted; "
            "override train.min_tokens_per_s_window_min; was --min-tokens-per-s-window)",
        ),
    )
    add_eval_task_flags(p)
    p.add_argument(
        "--min-tokens-per-s-always",
        dest="min_tokens_per_s_always",
        action="store_true",
        default=None,
        help="the floor ends the run at any time, not only in its window",
    )
    p.add_argument(
        "--stop-grace-s",
        type=float,
        default=25.0,
        help="SIGTERM/SIGHUP to exit in at most this many seconds: the checkpoint first, then MLflow "
        "with what is left (default 25; GCP gives 30 s, AWS 120 s)",
    )
    p.add_argument("--peak-tflops", type=float, help="device bf16 peak for MFU (default: from the GPU's name)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config key, e.g. --set optim.lr=1e-3 (repeatable; applied last)",
    )
    p.add_argument("--resume-from-latest", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even if the config or data differ from the checkpoint's (logged as a tag)",
    )
    p.add_argument(
        "--reset-optimizer",
        action="store_true",
        help="resume the weights, step, data position and RNG but not the optimizer's state: the optimizer "
        "starts from zero moments (what it drops is logged); needed to resume with another optim.name",
    )
    _budget_flags(p.add_argument_group("budget guard (see docs/budget.md)"))
    s = p.add_argument_group("loss spikes")
    s.add_argument(
        "--inject-spike-at-step",
        type=int,
        metavar="N",
        help="steps N..N+K-1 train on rare-token batches (skipped if a natural spike comes first)",
    )
    s.add_argument("--spike-batches", type=int, default=5, metavar="K", help="injected steps (default 5)")
    s.add_argument("--force-inject", action="store_true", help="inject even after a natural spike")
    old_spelling(
        s,
        "--skip-spike-steps",
        s.add_argument(
            "--spike-skip-steps",
            dest="spike_skip_steps",
            action="store_true",
            default=None,
            help="skip the optimizer update of a detected spike (override spike.skip_steps; was --skip-spike-steps)",
        ),
    )
    return p


# Each budget.* key of the config is the flag --budget-<key>; a flag given wins over the file.
BUDGET_HELP: dict[str, str] = {
    "cap_usd": "hard dollar cap; enables the guard (the lab: 35.0)",
    "alert_usd": "email + Slack above this spend",
    "buffer_usd": "dollars the launch gate keeps aside for one restart, as plan does",
    "reserve_min": "minutes billed after the last step (final checkpoint, export, shutdown), counted in every "
    "projection",
    "check_every_min": "minutes between the guard's checks",
    "sidecar_interval_min": "the sidecar's --interval-min; a reading older than 3 intervals is stale",
    "unknown_grace_min": "stop with a checkpoint when the spend has been unknown this long",
    "stop_wait_s": "projected over the cap: wait this long for a step boundary to checkpoint at, then exit 4 "
    "without one",
    "max_rate_usd_per_hr": "refuse to launch above this hourly rate (the lab's rule: 1.40)",
    "fit": "--total-steps becomes an upper bound: at every check the end moves to what the money (and "
    "--budget-max-hours) still pays for, and the wsd decay reaches min_lr exactly there (needs "
    "optim.schedule wsd)",
    "max_hours": "with --budget-fit: hours of wall clock the run may take, from its first start (downtime "
    "included; kept in the budget ledger)",
    "expected_step_s": "measured seconds per optimizer step, for the planned cost (default: from the GPU's peak)",
    "assumed_mfu": "MFU (honest accounting) assumed for the planned cost when --budget-expected-step-s is not "
    "given, as plan's",
}
# Earlier spellings, accepted for one release with a notice.
BUDGET_OLD = {
    "max_rate_usd_per_hr": "--max-rate-usd-per-hr",
    "fit": "--fit-to-budget",
    "max_hours": "--max-hours",
    "expected_step_s": "--expected-step-s",
    "assumed_mfu": "--assumed-mfu",
}


def budget_flag(key: str) -> str:
    return "--budget-" + key.replace("_", "-")


def add_budget_flags(b: Any, keys: tuple[str, ...] | None = None, old: dict[str, str] | None = None) -> None:
    """The flags of the config's budget section (all, or ``keys``), each overriding ``budget.<key>``; their
    defaults are the config's. ``plan`` adds a few of them with the same names; ``old``: the earlier spellings
    kept for one release (default: the trainer's)."""
    old = BUDGET_OLD if old is None else old
    defaults = C.BudgetConfig()
    for f in dataclasses.fields(C.BudgetConfig):
        if keys is not None and f.name not in keys:
            continue
        default = getattr(defaults, f.name)
        was = f"; was {old[f.name]}" if f.name in old else ""
        where = f"budget.{f.name}: the config's, else {default}" if default is not None else f"budget.{f.name}"
        text = f"{BUDGET_HELP[f.name]} ({where}{was})"
        if f.type in (bool, "bool"):
            action = b.add_argument(
                budget_flag(f.name), dest=f"budget_{f.name}", action="store_true", default=None, help=text
            )
        else:
            action = b.add_argument(budget_flag(f.name), dest=f"budget_{f.name}", type=float, default=None, help=text)
        if f.name in old:
            old_spelling(b, old[f.name], action)


def budget_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """{"budget.cap_usd": 35.0, ...} for the budget flags given."""
    out = {}
    for f in dataclasses.fields(C.BudgetConfig):
        value = getattr(args, f"budget_{f.name}", None)
        if value is not None:
            out[f"budget.{f.name}"] = value
    return out


def _budget_flags(b: Any) -> None:
    b.add_argument(
        "--budget-curr-cost-uri",
        help="budget.json written by the billing sidecar (its --out; a path, "
        "file:// or http(s)://; an http(s) read sends $X1_BUDGET_TOKEN or $X1_BUDGET_TOKEN_FILE's token "
        "as a bearer token: budget_serve)",
    )
    add_budget_flags(b)
    b.add_argument("--force-launch", action="store_true", help="launch despite the gate (logged as a tag)")
    b.add_argument(
        "--dry-run-budget",
        action="store_true",
        help="check the budget source, plan, gate and alert channels (sends a test alert), then exit",
    )


def add_eval_task_flags(p: Any) -> None:
    """The in-loop task evaluation's flags (``train.eval_tasks*``): the trainer's, and plan's to price them."""
    p.add_argument(
        "--eval-tasks",
        help="task scores during training, e.g. hellaswag,arc_easy (override train.eval_tasks; docs/evaluation.md)",
    )
    p.add_argument(
        "--eval-tasks-every",
        type=int,
        metavar="STEPS",
        help="score the tasks every STEPS steps (override train.eval_tasks_every; 0: at the end only)",
    )
    p.add_argument(
        "--eval-tasks-limit",
        type=int,
        metavar="N",
        help="the first N items of each task (override train.eval_tasks_limit)",
    )
    p.add_argument(
        "--eval-tasks-max-s",
        type=float,
        metavar="S",
        help="at most S seconds each time; what is left is skipped (override train.eval_tasks_max_s)",
    )


def eval_cost(cfg: C.Config) -> Any:
    """The config's in-loop task evaluations as the money counts them (``budget.money.EvalCost``), estimated from
    their size (evals/cost.py) until one is timed: for plan, the launch gate and the guard alike."""
    from ..budget.money import EvalCost
    from ..evals.cost import eval_in_steps
    from ..evals.registry import task_list

    t = cfg.train
    if not t.eval_tasks.strip():
        return EvalCost()
    return EvalCost(
        every=t.eval_tasks_every,
        cap_s=t.eval_tasks_max_s,
        in_steps=eval_in_steps(task_list(t.eval_tasks), t.eval_tasks_limit, cfg.tokens_per_step()),
    )


def eval_task_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the task evaluation's flags set (those given)."""
    pairs = {
        "train.eval_tasks": args.eval_tasks,
        "train.eval_tasks_every": args.eval_tasks_every,
        "train.eval_tasks_limit": args.eval_tasks_limit,
        "train.eval_tasks_max_s": args.eval_tasks_max_s,
    }
    return {k: v for k, v in pairs.items() if v is not None}


def options_from(args: argparse.Namespace) -> TrainOptions:
    pairs = {
        "train.total_steps": args.total_steps,
        "checkpoint.every_steps": args.checkpoint_every_steps,
        "train.eval_every": args.eval_every,
        "train.log_every": args.log_every,
        "train.seed": args.seed,
        "train.device": args.device,
        "train.compile": args.compile,
        "train.min_tokens_per_s": args.min_tokens_per_s,
        "checkpoint.every_min": args.checkpoint_every_min,
        "checkpoint.remote": args.ckpt_remote,
        "checkpoint.remote_wait_min": args.checkpoint_remote_wait_min,
        "train.min_tokens_per_s_window_min": args.min_tokens_per_s_window_min,
        "train.min_tokens_per_s_always": args.min_tokens_per_s_always,
        "spike.skip_steps": args.spike_skip_steps,
        **eval_task_overrides(args),
        **budget_overrides(args),
    }
    return TrainOptions(
        config=args.config,
        data_dir=args.data_dir,
        ckpt_dir=Path(args.ckpt_dir),
        mlflow_uri=args.mlflow_uri,
        experiment=args.experiment,
        run_name=args.run_name,
        resume=args.resume_from_latest,
        allow_config_change=args.allow_config_change,
        reset_optimizer=args.reset_optimizer,
        peak_tflops=args.peak_tflops,
        overrides={k: v for k, v in pairs.items() if v is not None},
        sets=tuple(args.set),
        spike=SpikeOptions(
            inject_at_step=args.inject_spike_at_step, batches=args.spike_batches, force_inject=args.force_inject
        ),
        stop_grace_s=args.stop_grace_s,
        curr_cost_uri=args.budget_curr_cost_uri,
        force_launch=args.force_launch,
        dry_run_budget=args.dry_run_budget,
    )


def warn_visible_secrets(opts: TrainOptions) -> None:
    """The URL flags that carry a secret, named once (rank 0 only): ``ps`` shows them to every local user."""
    if os.environ.get("RANK", "0") != "0":
        return
    redact.warn_if_visible("--mlflow-uri", opts.mlflow_uri, redact.MLFLOW_CREDENTIALS)
    redact.warn_if_visible("--budget-curr-cost-uri", opts.curr_cost_uri, redact.BUDGET_CREDENTIALS)


def budget_of_command(cmd: list[str]) -> tuple[float | None, str | None]:
    """(cap, budget source) a train command will run with: its flags, else its config's budget section. (None,
    None) when ``cmd`` is not recognisably x1's trainer or its config cannot be read (the trainer says why)."""
    at = next((i for i, a in enumerate(cmd) if a == "x1_pretrain.train" or a.endswith("x1_pretrain/train.py")), None)
    if at is None:
        return None, None
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):  # the trainer itself reports bad flags and old spellings
        try:
            args, _ = build_parser().parse_known_args(cmd[at + 1 :])
        except SystemExit:
            return None, None
        opts = options_from(args)
        try:
            cfg = C.load(opts.config, opts.overrides, list(opts.sets))
        except C.ConfigError:
            return opts.overrides.get("budget.cap_usd"), opts.curr_cost_uri
    return cfg.budget.cap_usd, opts.curr_cost_uri
