"""The run bundle's ``manifest.json``: what was run, on what, for how much, and how it ended.

Built from the MLflow run and the final checkpoint's ``trainer_state.json`` (which the trainer wrote on
the training machine, so versions and config are the run's, not the exporter's). ``dod`` reads it back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..budget.guard import format_time, parse_time
from ..budget.ledger import LEDGER_FILE
from ..budget.ledger import read as read_ledger
from ..budget.providers import APIS
from ..budget.source import read_source
from ..ckpt import checkpoint as ck
from ..core import names as N
from ..core import redact
from ..core.config import ModelConfig, upgrade
from ..core.errors import X1Error
from ..core.fileio import sha256_file
from ..evals.registry import TASKS
from ..model import flops
from .runs import MetricPoint, RunRecord

_log = logging.getLogger(__name__)

FORMAT = "x1-run-manifest/1"
BUNDLE_MODEL = "final.safetensors"


@dataclass(frozen=True)
class FinalCheckpoint:
    """The final weights and the step dir they were copied from (verified)."""

    weights: Path  # ckpt_dir/final.safetensors
    step_dir: Path  # ckpt_dir/step_NNNNNNN
    state: dict[str, Any]  # its trainer_state.json
    sha256: str  # of final.safetensors (= the step dir's model.safetensors)


def locate_final(run: RunRecord, ckpt_dir: Path | None) -> FinalCheckpoint:
    """Find and verify the run's final checkpoint from its tags (or under ``ckpt_dir`` when it moved)."""
    step_tag, weights_tag = run.tags.get(N.TAG_FINAL_CHECKPOINT), run.tags.get(N.TAG_FINAL_SAFETENSORS)
    if not step_tag or not weights_tag:
        raise X1Error(
            f"run {run.run_id} has no final checkpoint: its tags final_checkpoint/final_safetensors are "
            f"not set (status {run.status}; the trainer sets them when it finishes and writes "
            "final.safetensors). Export a finished run, or finish this one with --resume-from-latest"
        )
    step_dir, weights = Path(step_tag), Path(weights_tag)
    if ckpt_dir is not None:
        step_dir, weights = ckpt_dir / step_dir.name, ckpt_dir / weights.name
    hint = " (pass --ckpt-dir DIR if the checkpoints were moved)"
    if not weights.is_file():
        raise X1Error(f"final checkpoint missing: {weights} does not exist{hint}")
    if not step_dir.is_dir():
        raise X1Error(
            f"final checkpoint missing: {step_dir} (the step dir final.safetensors was copied from) "
            f"does not exist{hint}"
        )
    state, problem = ck.verify(step_dir)
    if state is None:
        raise X1Error(f"final checkpoint {step_dir} is not intact: {problem}")
    digest = sha256_file(weights)
    expected = state.get("files", {}).get(ck.MODEL_FILE)
    if digest != expected:
        raise X1Error(
            f"{weights} (sha256 {digest[:12]}) is not a copy of {step_dir / ck.MODEL_FILE} "
            f"(sha256 {str(expected)[:12]}); was the checkpoint dir reused by another run?"
        )
    tagged = run.tags.get(N.TAG_FINAL_SAFETENSORS_SHA256)
    if tagged and tagged != digest:
        raise X1Error(
            f"{weights} (sha256 {digest[:12]}) is not the file run {run.run_id} recorded "
            f"(final_safetensors_sha256 {tagged[:12]}); it was overwritten by a later run"
        )
    if state.get("mlflow_run_id") not in (None, run.run_id):
        raise X1Error(f"{step_dir} belongs to MLflow run {state.get('mlflow_run_id')}, not {run.run_id}")
    return FinalCheckpoint(weights, step_dir, state, digest)


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _mean(points: list[MetricPoint]) -> float | None:
    vals = [p.value for p in points if math.isfinite(p.value)]
    return sum(vals) / len(vals) if vals else None


def _cluster(run: RunRecord, state: dict[str, Any], provider: str | None, instance_type: str | None) -> dict[str, Any]:
    """GPU/CPU/RAM/host. The trainer records the host and device name; the rest is measured here when the
    export runs on the training host (as the lab does, before terminating the instance)."""
    host, device = run.tags.get(N.TAG_HOST), run.tags.get(N.TAG_DEVICE) or ""
    world = int(state.get("world_size") or 1)
    recorded = state.get("machine") if isinstance(state.get("machine"), dict) else None
    if recorded:
        facts, source = dict(recorded), "recorded by the trainer"
    elif host and host == socket.gethostname():
        from ..core.env import machine

        facts, source = machine(), "measured by export_run on the training host"
    else:
        facts, source = {}, f"the training host {host!r} is not this machine: only its name and device are known"
    on_gpu = bool(device) and not device.startswith("cpu")
    return {
        "hostname": host,
        "device": device or None,
        "world_size": world,
        "gpu_name": facts.get("gpu_name") or (device if on_gpu else None),
        "gpu_count": facts.get("gpu_count") if facts.get("gpu_count") is not None else (world if on_gpu else 0),
        "gpu_memory_gb": facts.get("gpu_memory_gb"),
        "cpu_count": facts.get("cpu_count"),
        "ram_gb": facts.get("ram_gb"),
        "platform": facts.get("platform"),
        "provider": provider,
        "instance_type": instance_type,
        "source": source,
    }


def _sidecar_provider(source: str) -> str | None:
    try:
        local = source[len("file://") :] if source.startswith("file://") else source
        raw = json.loads(Path(local).read_text()) if "://" not in local else {}
        return raw.get("provider")
    except (OSError, ValueError, AttributeError):
        return None


def _ledger_count(ckpt_dir: Path) -> tuple[float, datetime, Path] | None:
    """(spent, when, path) from the guard's ledger beside the checkpoints, or None."""
    path = ckpt_dir / LEDGER_FILE
    data, problem = read_ledger(path)
    if problem:
        _log.warning(problem)
    memory = (data or {}).get("memory") or {}
    spent, at = _finite(memory.get("spent_usd")), parse_time(memory.get("spent_at_utc"))
    return (spent, at, path) if spent is not None and at is not None else None


def _dollars(
    run: RunRecord, final: FinalCheckpoint, spent_usd: float | None, curr_cost_uri: str | None
) -> tuple[dict[str, Any], str | None]:
    """(dollars section, provider named by budget.json). Order: --spent-usd; --budget-curr-cost-uri; the larger of the
    guard's ledger (``budget_ledger.json`` beside the checkpoints) and the run's budget.json when that is not
    older than the run's end; the checkpoint's snapshot. A budget.json last written before the run ended is
    never used without a warning, printed and recorded in ``notes``."""
    state = final.state
    snap = ck.guard_snapshot(state)
    cap = (snap or {}).get("cap_usd") or _finite(run.tags.get(N.TAG_BUDGET_CAP_USD))
    out: dict[str, Any] = {"spent_usd": None, "cap_usd": cap, "source": None, "notes": []}
    if spent_usd is not None:
        return {**out, "spent_usd": spent_usd, "source": "--spent-usd given to export_run"}, None
    source = curr_cost_uri or run.tags.get(N.TAG_BUDGET_CURR_COST_URI) or run.tags.get(N.OLD_TAG_BUDGET_SOURCE)
    reading = read_source(source) if source else None
    if curr_cost_uri and reading is not None and reading.snapshot is None:
        raise X1Error(f"--budget-curr-cost-uri {redact.url(curr_cost_uri)}: {reading.problem}")
    sidecar = reading.snapshot if reading is not None else None
    ended = datetime.fromtimestamp(run.end_ms / 1000, timezone.utc) if run.end_ms else None
    stale = sidecar is not None and ended is not None and sidecar.last_update_utc < ended - timedelta(minutes=1)
    if stale:
        assert sidecar is not None and ended is not None
        note = (
            f"{redact.url(str(source))} was last updated {format_time(sidecar.last_update_utc)}, before the run "
            f"ended ({format_time(ended)}): the spend after it is not in it"
        )
        _log.warning(note)
        out["notes"].append(note)
    counted = None if curr_cost_uri else _ledger_count(final.step_dir.parent)
    if counted is not None and (sidecar is None or stale or sidecar.spent_usd < counted[0]):
        counted_usd, at, path = counted
        if sidecar is not None:
            out["notes"].append(
                f"the sidecar's budget.json (${sidecar.spent_usd:.2f} at "
                f"{format_time(sidecar.last_update_utc)}) is {'stale' if stale else 'lower'}: not used"
            )
        return {
            **out,
            "spent_usd": counted_usd,
            "counted_at_utc": format_time(at),
            "source": f"{path} (the budget guard's count at {format_time(at)}, never below a reading of "
            f"{redact.url(source) if source else 'the budget source'})",
        }, _sidecar_provider(str(source)) if source else None
    if sidecar is not None:
        assert source is not None
        why = (
            "given as --budget-curr-cost-uri"
            if curr_cost_uri
            else ("at or above the guard's ledger" if counted else "the run's budget source; no ledger found")
        )
        return {
            **out,
            **sidecar.to_json(),
            "source": f"{redact.url(source)} (the billing sidecar's budget.json, {why})",
        }, _sidecar_provider(source)
    if reading is not None:
        _log.warning(f"{reading.problem}; using the budget snapshot in the final checkpoint")
    if snap is not None:
        good = snap.get("last_good") or {}
        snap_spent = _finite(snap.get("spent_usd"))
        return {
            **out,
            "spent_usd": snap_spent if snap_spent is not None else _finite(good.get("spent_usd")),
            "rate_usd_per_hr": good.get("rate_usd_per_hr"),
            "last_update_utc": good.get("last_update_utc"),
            "projected_total_usd": _finite(snap.get("projected_usd")),
            "source": "budget snapshot in the final checkpoint's trainer_state.json",
        }, None
    return {
        **out,
        "source": "the run had no budget guard (--budget-cap-usd); pass --budget-curr-cost-uri "
        "PATH or --spent-usd X to export_run",
    }, None


def _of(points: list[MetricPoint], name: str) -> list[MetricPoint]:
    return [p for p in points if p.name == name]


def _throughput(
    run: RunRecord, points: list[MetricPoint], state: dict[str, Any], model: ModelConfig, world: int
) -> dict[str, Any]:
    fpt = flops.flops_per_token(model)
    tokens, secs = int(state.get("tokens_seen") or 0), _finite(state.get("train_time_s")) or 0.0
    tps = tokens / secs if secs > 0 else None
    device = run.tags.get(N.TAG_DEVICE) or ""
    peak = None if device.startswith("cpu") else flops.peak_tflops(device)
    logged_mfu = _mean(_of(points, N.TRAIN_MFU))
    if peak is None and logged_mfu and tps:  # an unlisted GPU run with --peak-tflops: recover the peak
        mean_logged = _mean(_of(points, N.TRAIN_TOKENS_PER_S)) or tps
        peak = mean_logged * fpt.honest / (logged_mfu * 1e12 * world)

    def util(f: int) -> float | None:
        return tps * f / (peak * 1e12 * world) if tps and peak else None

    return {
        "accounting": "honest: 6N + 6*d_model*vocab (tied LM head) + 12*L*H*Q*T (attention), as nanoGPT and "
        "PaLM count; the lab's 6N (non-embedding) figure is shown beside it, labelled",
        "flops_per_token": {"honest": fpt.honest, "lab_6n": fpt.lab_6n},
        "mean_tokens_per_s": tps,
        "mean_tokens_per_s_basis": "tokens seen / time inside optimizer steps",
        "mean_logged_tokens_per_s": _mean(_of(points, N.TRAIN_TOKENS_PER_S)),
        "peak_tflops_per_device": peak,
        "devices": world,
        "mfu": util(fpt.honest),
        "mfu_lab_6n": util(fpt.lab_6n),
        "mean_logged_mfu": logged_mfu,
        "mfu_note": None if peak else f"no bf16 peak is known for {device or 'this device'}: MFU not reported",
    }


@dataclass(frozen=True)
class Facts:
    """What the user tells the exporter that the run itself cannot know (export_run's flags)."""

    spent_usd: float | None = None  # the bill, for a run without a budget guard
    curr_cost_uri: str | None = None  # the sidecar's final budget.json, if not the run's source
    provider: str | None = None
    instance_type: str | None = None


def _evals(points: list[MetricPoint], cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The task scores of the run's latest evaluation (``eval/<task>/acc(_norm)``), with the protocol: per task
    the items actually scored (``eval/<task>/n``; None for a run that did not record it), the ``limit`` asked
    (``train.eval_tasks_limit``) apart from it, the split and the set's sha256. None when the run scored no task."""
    by_task: dict[str, list[MetricPoint]] = {}
    for p in points:
        if p.name.startswith(N.EVAL_TASK_PREFIX) and p.name.count("/") == 2:
            by_task.setdefault(p.name.split("/")[1], []).append(p)
    if not by_task:
        return None
    limit = (cfg.get("train") or {}).get("eval_tasks_limit")
    latest: dict[str, dict[str, Any]] = {}
    for task, ps in by_task.items():
        step, known = max(p.step for p in ps), TASKS.get(task)
        values = {p.name.split("/")[2]: p.value for p in ps if p.step == step}
        scored = values.pop("n", None)  # what was scored, never what was asked: skipped items are not in it
        latest[task] = {
            "step": step,
            "acc_norm": None,
            **values,
            "n": None if scored is None else int(scored),
            "limit": limit,
            "split": known.split if known else None,
            "data_sha256": known.sha256 if known else None,
        }
    return {
        "tasks": latest,
        "limit": limit,
        "protocol": "zero-shot, lm-evaluation-harness 0.4 prompts and normalisation (docs/evaluation.md)",
    }


def build(
    run: RunRecord, final: FinalCheckpoint, points: list[MetricPoint], replayed: int, facts: Facts = Facts()
) -> dict[str, Any]:
    spent_usd, curr_cost_uri, provider, instance_type = (
        facts.spent_usd,
        facts.curr_cost_uri,
        facts.provider,
        facts.instance_type,
    )
    state = final.state
    cfg = upgrade(state.get("config") or {})  # a checkpoint from before a key was renamed reads the same
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    model = ModelConfig(**{k: v for k, v in (cfg.get("model") or {}).items() if k in names})
    recomputed = hashlib.sha256(json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    if recomputed != state.get("config_sha256"):
        _log.warning(
            f"the config in {final.step_dir.name} hashes to {recomputed[:12]}, not the recorded "
            f"{str(state.get('config_sha256'))[:12]}"
        )
    dollars, budget_provider = _dollars(run, final, spent_usd, curr_cost_uri)
    if provider is None:
        provider = budget_provider or next(
            (a.name for a in APIS.values() if a.id_env and os.environ.get(a.id_env)), None
        )
    versions = dict(state.get("versions") or {})
    versions["x1_pretrain_git_commit"] = run.tags.get(N.TAG_GIT_COMMIT)
    config_file = run.tags.get(N.TAG_CONFIG_FILE)
    restart_points = _of(points, N.RUN_RESTARTS)
    restarts = max(
        [
            int(state.get("restarts") or 0),
            int(_finite(run.tags.get(N.TAG_RESTARTS)) or 0),
            *(int(p.value) for p in restart_points),
        ]
    )
    val = _of(points, N.VAL_LOSS)
    elapsed = (run.end_ms - run.start_ms) / 1000 if run.end_ms and run.start_ms else None
    world = int(state.get("world_size") or 1)
    return {
        "format": FORMAT,
        "exported_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seed": (cfg.get("train") or {}).get("seed"),
        "versions": versions,
        "config_sha256": state.get("config_sha256"),
        "config_file": {
            "path": config_file,
            "sha256": sha256_file(Path(config_file)) if config_file and Path(config_file).is_file() else None,
            "note": "the YAML file as found at export time; config_sha256 hashes the resolved config "
            "(file + flags + --set) the run used",
        },
        "config": cfg,
        "compile": {
            "requested": (cfg.get("train") or {}).get("compile_mode")
            if (cfg.get("train") or {}).get("compile")
            else "off",
            "effective": run.tags.get(N.TAG_COMPILE_MODE_EFFECTIVE),
            "scope": run.tags.get(N.TAG_COMPILE_SCOPE_EFFECTIVE)
            or (cfg.get("train") or {}).get("compile_scope", "model"),
            "fallback_error": run.tags.get(N.TAG_COMPILE_FALLBACK),
            "attention": run.tags.get(N.TAG_ATTENTION_EFFECTIVE),
            "kernels": run.tags.get(N.TAG_KERNELS),
        },
        "cluster": _cluster(run, state, provider, instance_type),
        "dollars": dollars,
        "progress": {
            "steps": state.get("step"),
            "total_steps": (cfg.get("train") or {}).get("total_steps"),
            "budget_fit": bool((cfg.get("budget") or {}).get("fit")),
            "planned_end_step": (state.get("schedule") or {}).get("end_step"),
            "decay_start_step": (state.get("schedule") or {}).get("decay_start"),
            "end_reason": run.tags.get(N.TAG_END_REASON),
            "tokens": state.get("tokens_seen"),
            "train_time_s": state.get("train_time_s"),
            "wall_clock_s": state.get("wall_clock_s"),
            "elapsed_s": elapsed,
            "restarts": restarts,
            "restart_steps": [p.step for p in restart_points],
        },
        "loss": {
            "final_train": _finite(state.get("last_loss")),
            "final_val": _finite(state.get("last_val_loss")),
            "final_val_bpb": _finite(state.get("last_val_bpb")),
            "final_val_step": val[-1].step if val else None,
            "min_val": min((p.value for p in val), default=None),
        },
        "throughput": _throughput(run, points, state, model, world),
        "evals": _evals(points, cfg),
        "parameters": dataclasses.asdict(flops.param_counts(model)),
        "final_weights": {
            "file": BUNDLE_MODEL,
            "sha256": final.sha256,
            "source_checkpoint": final.step_dir.name,
            "source_path": str(final.step_dir.resolve()),
            "source_sha256": state.get("files", {}).get(ck.MODEL_FILE),
        },
        "mlflow": {
            "uri": redact.url(run.uri),
            "run_id": run.run_id,
            "experiment": run.experiment_name,
            "run_name": run.run_name,
            "status": run.status,
            "metric_points": len(points),
            "replayed_points_dropped": replayed,
        },
    }
