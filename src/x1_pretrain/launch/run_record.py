"""What the MLflow run records about itself: the params and resolved config of a fresh run, the tags of each
start (device, kernels the forward really runs, the config file, restarts, the guard), the metrics an earlier
process could not deliver, and at the end which files are the final weights."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ckpt import checkpoint as ck
from ..core import config as C
from ..core import contract, redact
from ..core import names as N
from ..core.env import versions
from ..data.tokens import TokenData
from ..model.transformer import Transformer, sdpa_backend
from ..trainer.tracking import MlflowTracker, NullTracker, run_tags
from .resume import Resume

if TYPE_CHECKING:
    from .build import Context


def attention_effective(model: Transformer, precision: str) -> str:
    """``flash-attn``, or ``sdpa:<the backend SDPA dispatches to>`` (flash, efficient, cudnn, math)."""
    import torch

    if model.kernels.use_flash:
        return "flash-attn"
    device = next(model.parameters()).device
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32  # the autocast dtype of the forward
    return f"sdpa:{sdpa_backend(model.config, dtype, device)}"


def kernel_tags(model: Transformer, precision: str = "fp32") -> dict[str, str]:
    """What the forward actually runs, for MLflow and the manifest (a switch can be overridden by the device)."""
    k, m = model.kernels, model.config
    return {
        N.TAG_ATTENTION_EFFECTIVE: attention_effective(model, precision),
        N.TAG_KERNELS: f"fused_loss={k.fused_loss} (chunk {k.loss_chunk_tokens}), vocab rows "
        f"{model.lm_head.weight.shape[0]} for {m.vocab_size}, fused_projections={m.fused_projections}, "
        f"residual={'bf16' if k.residual_dtype is not None else 'fp32'}, "
        f"deterministic={k.deterministic}",
    }


def run_tags_device(device: Any) -> str:
    from ..core.env import device_name

    return device_name(device)


def open_tracker(ctx: Context, uri: str, artifact_location: str | None, resume: Resume, data: TokenData) -> Any:
    cfg, opts, log = ctx.cfg, ctx.opts, ctx.log
    if not ctx.world.main:
        return NullTracker()
    run_name = opts.run_name or f"{Path(opts.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker = MlflowTracker(
        uri, artifact_location, run_name, run_id=resume.state.get("mlflow_run_id"), experiment=opts.experiment
    )
    if resume.found is not None and resume.state.get("mlflow_uri") not in (None, redact.url(uri)):
        log(
            f"warning: the checkpoint's MLflow store was {resume.state.get('mlflow_uri')}; logging to "
            f"{redact.url(uri)} now"
        )
    if resume.found is None:
        tracker.log_params(
            {
                **C.flatten(cfg.to_dict()),
                "config_sha256": cfg.sha256(),
                "seed": cfg.train.seed,
                "world_size": ctx.world.size,
                "data_dir": str(data.directory),
                "tokens_per_step": cfg.tokens_per_step(),
                **{f"version.{k}": v for k, v in versions().items()},
            }
        )
        cfg_file = ctx.ckpt_dir / f".resolved-config-{os.getpid()}.yaml"
        cfg_file.write_text(f"# sha256 {cfg.sha256()}\n" + C.to_yaml(cfg))
        tracker.log_artifact(cfg_file, "config")
        cfg_file.unlink(missing_ok=True)
    tags: dict[str, Any] = {
        **run_tags(run_tags_device(ctx.device)),
        N.TAG_CONFIG_FILE: str(opts.config),
        N.TAG_RESTARTS: restarts(),
    }
    if ctx.guard is not None:
        tags.update(ctx.guard.tags())
    if resume.changes:
        tags[N.TAG_CONFIG_CHANGED_ON_RESUME] = "; ".join(resume.changes)[:4000]
    tracker.set_tags(tags)
    if resume.found is not None:
        tracker.log_metrics(resume.found.step, {N.RUN_RESTARTS: float(restarts())})
        again = tracker.redeliver(ctx.ckpt_dir, resume.found.step)
        if again:
            log(f"MLflow: {again:,} metrics an earlier process could not deliver are being sent again")
    log(
        f"MLflow: {redact.url(uri)} run {tracker.run_id or '(pending: server unreachable)'}"
        + (" (continued)" if resume.found is not None else "")
    )
    return tracker


def restarts() -> int:
    """How many times the watchdog has relaunched this run (it sets X1_RESTART_COUNT)."""
    return int(os.environ.get(contract.RESTART_COUNT_ENV, "0") or 0)


def tag_final(tracker: Any, ckpt_dir: Path, step_dir: Path, hashes: dict[str, str]) -> None:
    """Record in MLflow which files are the run's final weights (export_run and dod check them)."""
    tracker.set_tags(
        {
            N.TAG_FINAL_CHECKPOINT: str(step_dir.resolve()),
            N.TAG_FINAL_SAFETENSORS: str((ckpt_dir / ck.FINAL_MODEL).resolve()),
            N.TAG_FINAL_SAFETENSORS_SHA256: hashes[ck.FINAL_MODEL],
        }
    )
