"""The cross-field rules of a configuration: each problem names its key and the fix. ``config.load`` runs
them after every key and type has been read, and reports all problems at once."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import BudgetConfig, Config, OptimConfig


def batch_problems(batch: int, micro: int, accum: int, world_size: int = 1) -> list[str]:
    """The global batch is ``accum`` micro-batches of ``micro`` sequences, shared out over the ranks."""
    if batch <= 0 or micro <= 0:
        return []
    if batch % micro:
        return [
            f"train.batch_size: {batch} is not a multiple of train.micro_batch_size {micro}; choose a "
            f"micro-batch that divides it"
        ]
    chunks = batch // micro
    if accum != chunks:
        return [
            f"train.grad_accum_steps: {accum} disagrees with train.batch_size {batch} / train.micro_batch_size "
            f"{micro} = {chunks} micro-batches a step; leave grad_accum_steps out (it is derived) or set it to "
            f"{chunks} (with N ranks each runs {chunks}/N)"
        ]
    if world_size > 1 and chunks % world_size:
        fits = [n for n in range(1, chunks + 1) if chunks % n == 0 and n <= 64]
        return [
            f"train.batch_size: {batch} / train.micro_batch_size {micro} = {chunks} micro-batches a step cannot "
            f"be shared out over {world_size} ranks; run on {', '.join(map(str, fits))} ranks, or choose a "
            "micro_batch_size that gives a multiple of the rank count"
        ]
    return []


def validate(cfg: Config, world_size: int = 1) -> list[str]:
    """Cross-field rules. Returns every problem found (empty when the config is coherent)."""
    m, o, t = cfg.model, cfg.optim, cfg.train
    p: list[str] = []
    for key in ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "seq_len", "vocab_size"):
        if getattr(m, key) <= 0:
            p.append(f"model.{key}: must be positive, got {getattr(m, key)}")
    if m.n_head > 0 and m.d_model % m.n_head:
        p.append(f"model.d_model: {m.d_model} is not divisible by model.n_head {m.n_head}")
    elif m.n_head > 0 and m.head_dim % 2:
        p.append(f"model.d_model: head_dim {m.head_dim} must be even for RoPE")
    if m.n_kv_head > 0 and m.n_head % m.n_kv_head:
        p.append(f"model.n_head: {m.n_head} is not divisible by model.n_kv_head {m.n_kv_head}")
    if m.init_std <= 0 or m.norm_eps <= 0 or m.rope_base <= 0:
        p.append("model.init_std, model.norm_eps and model.rope_base must be positive")
    if not 1 <= m.vocab_pad_multiple <= 1024:
        p.append(
            f"model.vocab_pad_multiple: must be in [1, 1024] (1 turns padding off; 128 suits tensor cores), "
            f"got {m.vocab_pad_multiple}"
        )
    if o.lr <= 0:
        p.append(f"optim.lr: must be positive, got {o.lr}")
    if not 0 <= o.min_lr <= o.lr:
        p.append(f"optim.min_lr: must be in [0, optim.lr={o.lr}], got {o.min_lr}")
    if not 0 < o.decay_fraction <= 1:
        p.append(f"optim.decay_fraction: must be in (0, 1], got {o.decay_fraction}")
    if o.warmup_steps < 0:
        p.append(f"optim.warmup_steps: must be >= 0, got {o.warmup_steps}")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(o, key) < 1:
            p.append(f"optim.{key}: must be in [0, 1), got {getattr(o, key)}")
    if o.weight_decay < 0 or o.grad_clip < 0 or o.eps <= 0:
        p.append("optim.weight_decay and optim.grad_clip must be >= 0 and optim.eps > 0")
    if o.muon_lr <= 0 or o.muon_weight_decay < 0:
        p.append(
            f"optim.muon_lr must be positive and optim.muon_weight_decay >= 0, got {o.muon_lr}, {o.muon_weight_decay}"
        )
    if not 0 <= o.muon_momentum < 1:
        p.append(f"optim.muon_momentum: must be in [0, 1), got {o.muon_momentum}")
    if not 1 <= o.muon_ns_steps <= 20:
        p.append(f"optim.muon_ns_steps: must be in [1, 20] (5 is the published choice), got {o.muon_ns_steps}")
    for key in (
        "total_steps",
        "batch_size",
        "micro_batch_size",
        "log_every",
        "eval_every",
        "eval_batches",
        "prefetch",
        "throughput_window",
        "loss_chunk_tokens",
    ):
        if getattr(t, key) <= 0:
            p.append(f"train.{key}: must be positive, got {getattr(t, key)}")
    p.extend(batch_problems(t.batch_size, t.micro_batch_size, t.grad_accum_steps, world_size))
    s = cfg.spike
    if not 0 < s.ema_alpha <= 1:
        p.append(f"spike.ema_alpha: must be in (0, 1], got {s.ema_alpha}")
    if s.baseline_steps < 1 or s.grad_window < 1 or s.loss_sigma <= 0 or s.grad_factor <= 1 or s.min_loss_jump < 0:
        p.append(
            "spike: baseline_steps and grad_window must be >= 1, loss_sigma > 0, grad_factor > 1, min_loss_jump >= 0"
        )
    c = cfg.checkpoint
    if c.keep_last < 1:
        p.append(f"checkpoint.keep_last: must be at least 1, got {c.keep_last}")
    if c.every_steps <= 0:
        p.append(f"checkpoint.every_steps: must be positive, got {c.every_steps}")
    if c.every_min < 0:
        p.append(f"checkpoint.every_min: must be >= 0 (0 turns the wall-clock cadence off), got {c.every_min}")
    if not 0 <= c.remote_wait_min <= 24 * 60:
        p.append(
            f"checkpoint.remote_wait_min: must be between 0 (no wait: exit 8 at once) and 1440 minutes, got "
            f"{c.remote_wait_min}"
        )
    if c.remote is not None and not re.match(r"^s3://[^/]+", c.remote):
        p.append(f"checkpoint.remote: expected s3://BUCKET/PREFIX (or null: no mirror), got {c.remote!r}")
    if t.min_tokens_per_s_window_min < 0:
        p.append(f"train.min_tokens_per_s_window_min: must be >= 0, got {t.min_tokens_per_s_window_min}")
    if t.min_tokens_per_s is not None and t.min_tokens_per_s <= 0:
        p.append(f"train.min_tokens_per_s: must be positive when set, got {t.min_tokens_per_s}")
    if t.eval_tasks_every < 0 or t.eval_tasks_max_s <= 0 or (t.eval_tasks_limit is not None and t.eval_tasks_limit < 1):
        p.append(
            f"train.eval_tasks_every must be >= 0 (0: at the end only), train.eval_tasks_max_s positive and "
            f"train.eval_tasks_limit at least 1 when set; got {t.eval_tasks_every}, {t.eval_tasks_max_s}, "
            f"{t.eval_tasks_limit}"
        )
    if t.device != "auto" and t.device != "cpu" and not t.device.startswith("cuda"):
        p.append(f"train.device: {t.device!r} is not auto, cpu, cuda or cuda:N")
    return p + _budget_problems(cfg.budget, o)


def _budget_problems(b: BudgetConfig, o: OptimConfig) -> list[str]:
    p: list[str] = []
    if b.cap_usd is not None and b.cap_usd <= 0:
        p.append(f"budget.cap_usd: must be positive (or null: no guard), got {b.cap_usd}")
    if b.cap_usd is not None and not 0 <= b.alert_usd < b.cap_usd:
        p.append(
            f"budget.alert_usd: {b.alert_usd} must be below budget.cap_usd {b.cap_usd} and >= 0 "
            "(--budget-alert-usd, --budget-cap-usd)"
        )
    for key in ("check_every_min", "sidecar_interval_min", "unknown_grace_min", "stop_wait_s", "max_rate_usd_per_hr"):
        if getattr(b, key) <= 0:
            p.append(f"budget.{key}: must be positive, got {getattr(b, key)}")
    for key in ("buffer_usd", "reserve_min"):
        if getattr(b, key) < 0:
            p.append(f"budget.{key}: must be >= 0, got {getattr(b, key)}")
    for key in ("max_hours", "expected_step_s"):
        if getattr(b, key) is not None and getattr(b, key) <= 0:
            p.append(f"budget.{key}: must be positive when set, got {getattr(b, key)}")
    if not 0 < b.assumed_mfu <= 1:
        p.append(f"budget.assumed_mfu: must be in (0, 1], got {b.assumed_mfu}")
    if b.fit and o.schedule != "wsd":
        p.append(
            f"budget.fit: needs optim.schedule 'wsd', not {o.schedule!r} (a cosine's shape depends on "
            "a total that is not known in advance); use --set optim.schedule=wsd"
        )
    return p
