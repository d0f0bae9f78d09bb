"""Typed, frozen configuration loaded strictly from YAML.

Every section is a frozen dataclass whose fields carry their meaning in a docstring-like comment.
Loading checks every key and type and every cross-field rule, and reports *all* problems at once
as one :class:`ConfigError`, before any data is read or any tensor is made.

Precedence: the YAML file, then the lab's own flags (``--total-steps`` …), then ``--set a.b=value``.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .config_rules import validate
from .defaults import DEFAULT_MFU, DEFAULT_RESERVE_MIN
from .errors import X1Error

_log = logging.getLogger(__name__)


def _notice(msg: str) -> None:
    _log.warning(f"deprecated: {msg}")


class ConfigError(X1Error):
    """One or more configuration problems, each naming its key and a hint."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n{lines}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    n_layer: int = 8  # transformer blocks
    d_model: int = 768  # residual width
    n_head: int = 12  # query heads; head_dim = d_model / n_head
    n_kv_head: int = 4  # key/value heads (GQA); must divide n_head
    d_ff: int = 2048  # SwiGLU hidden width
    seq_len: int = 1024  # context length in tokens
    vocab_size: int | Literal["auto"] = 50257  # ids the model embeds; auto: the data's (its meta.json vocab_size)
    norm: Literal["rmsnorm"] = "rmsnorm"  # the only norm (Llama's RMSNorm, pre-norm)
    norm_eps: float = 1e-5  # RMSNorm epsilon
    activation: Literal["swiglu"] = "swiglu"  # the MLP: SwiGLU (gate, up, down)
    pos_enc: Literal["rope"] = "rope"  # rotary position embeddings
    rope_base: float = 10000.0  # RoPE frequency base (theta)
    init_std: float = 0.02  # normal init of every weight matrix and the embedding
    tie_embeddings: bool = True  # LM head shares the token embedding
    vocab_pad_multiple: int = 128  # embedding/head rows rounded up to this inside the model (1: none); the
    # logits, the loss and the saved weights keep vocab_size rows
    fused_projections: bool = False  # q/k/v and gate/up as one matmul each; saved under Llama's names

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"  # muon: Muon on the hidden matrices, AdamW (below) on the rest
    lr: float = 3e-4  # peak learning rate (AdamW's; the schedule scales optim.muon_lr by the same factor)
    min_lr: float = 3e-5  # cosine floor
    warmup_steps: int = 1000  # linear warmup from lr/warmup_steps to lr
    schedule: Literal["cosine", "constant", "wsd"] = "cosine"  # wsd: warmup-stable-decay (trainer/schedule.py)
    decay_fraction: float = 0.2  # wsd: the share of the run spent decaying to min_lr
    decay_shape: Literal["linear", "1-sqrt", "cosine"] = "1-sqrt"  # wsd: the decay's shape
    beta1: float = 0.9  # AdamW first-moment decay
    beta2: float = 0.95  # AdamW second-moment decay
    eps: float = 1e-8  # AdamW denominator epsilon
    weight_decay: float = 0.1  # on 2-D weight matrices; never on norm gains
    decay_embedding: bool = False  # weight decay on the (tied) token embedding
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    muon_lr: float = 0.02  # muon: peak learning rate of the hidden matrices (docs/performance.md, optimizer A/B)
    muon_momentum: float = 0.95  # muon: momentum of the update's running mean
    muon_nesterov: bool = True  # muon: Nesterov momentum
    muon_weight_decay: float = 0.0  # muon: decoupled decay of the hidden matrices (lr * wd a step)
    muon_adjust_lr: Literal["original", "match_rms_adamw"] = "original"  # muon: per-shape step size;
    # original: sqrt(max(1, rows/cols)); match_rms_adamw: 0.2 sqrt(max(rows, cols)), AdamW-sized lr and decay
    muon_ns_steps: int = 5  # muon: Newton–Schulz rounds per update
    muon_impl: Literal["auto", "torch", "x1"] = "auto"  # muon: torch.optim.Muon where torch has it (auto), else x1's


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    total_steps: int = 84000  # optimizer steps
    batch_size: int = 512  # sequences per optimizer step (global, all ranks)
    micro_batch_size: int = 32  # sequences per forward/backward on one device
    grad_accum_steps: int = 0  # micro-batches per step over all ranks = batch_size / micro_batch_size
    # (0: derived; each of N ranks runs grad_accum_steps / N of them)
    seed: int = 42  # one seed for init, data order and every random stream
    precision: Literal["bf16", "fp32"] = "bf16"  # bf16 autocast with fp32 master weights, or plain fp32
    compile: bool = True  # torch.compile the model (--compile / --no-compile)
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "max-autotune"  # torch.compile mode
    )
    attention: Literal["flash", "sdpa"] = "flash"  # flash-attn when available on CUDA, else SDPA
    sdpa_cudnn: bool = False  # let SDPA pick cuDNN attention (off: open gradient reports, pytorch #150700)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    log_every: int = 10  # steps between metric logs
    eval_every: int = 1800  # steps between val evals (and one at the end)
    eval_batches: int = 20  # micro-batches in the fixed val set
    prefetch: int = 4  # batches prepared ahead by the loader thread
    min_tokens_per_s: float | None = None  # stop (exit 6) when the warm mean falls below this ...
    min_tokens_per_s_window_min: float = 60.0  # ... during the run's first this-many minutes of training
    min_tokens_per_s_always: bool = False  # ... or at any time (later drops are otherwise logged and alerted)
    throughput_window: int = 50  # steps in the warm throughput window
    fused_loss: bool = True  # LM head + cross-entropy in one pass over token chunks (no full logits)
    loss_chunk_tokens: int = 4096  # tokens per chunk of the one-pass loss
    bf16_residual: bool = False  # under bf16: the residual stream (and its gradient) in bf16, as llm.c
    compile_scope: Literal["model", "blocks"] = "model"  # one graph for the model, or each block fullgraph
    deterministic: bool = False  # deterministic kernels (flash-attn backward, cuBLAS): bitwise GPU resume
    eval_tasks: str = ""  # task scores during training: e.g. "hellaswag,arc_easy" (docs/evaluation.md)
    eval_tasks_every: int = 0  # ... every this many steps (0: only when the run ends)
    eval_tasks_limit: int | None = None  # ... on the first N items of each task (None: all)
    eval_tasks_max_s: float = 300.0  # ... in at most this many seconds each time (the rest is skipped, said)

    def __post_init__(self) -> None:
        if self.grad_accum_steps == 0 and self.micro_batch_size > 0 and self.batch_size % self.micro_batch_size == 0:
            object.__setattr__(self, "grad_accum_steps", self.batch_size // self.micro_batch_size)  # derived


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    every_steps: int = 1800  # steps between checkpoints (the lab's flag: --ckpt-every)
    every_min: float = 0.0  # and at most this many minutes of wall clock between them (0: steps only)
    keep_last: int = 3  # complete step_* dirs kept (plus any holding a PIN file)
    async_save: bool = True  # write on a background thread after a CPU snapshot
    remote: str | None = None  # s3://BUCKET/PREFIX: mirror each checkpoint there (--ckpt-remote; docs/running.md)
    remote_wait_min: float = 30.0  # minutes a resume with nothing local waits for an unreachable remote; then exit 8


@dataclass(frozen=True, kw_only=True)
class SpikeConfig:
    ema_alpha: float = 0.05  # weight of the newest loss in the moving baseline (window ~1/alpha steps)
    baseline_steps: int = 20  # steps the baseline observes before anything can be called a spike
    loss_sigma: float = 6.0  # a spike's loss is this many noise units above the baseline ...
    min_loss_jump: float = 0.5  # ... and at least this many nats above it
    grad_factor: float = 5.0  # or its grad norm is this many times the recent median
    grad_window: int = 50  # steps in that median
    skip_steps: bool = False  # skip the optimizer update of a detected spike (llm.c / OLMo-core style)


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """The budget guard (docs/budget.md). Each key is also the trainer's flag ``--budget-<key>``; ``cap_usd``
    null means no guard. Where the spend is read from (``--budget-curr-cost-uri``) is a flag only: it names a
    file or URL of one machine, and a URL may carry a key."""

    cap_usd: float | None = None  # hard dollar cap; enables the guard (the lab: 35)
    alert_usd: float = 30.0  # email + Slack once the spend passes this
    buffer_usd: float = 5.0  # kept aside by the launch gate (and plan) for one restart
    reserve_min: float = DEFAULT_RESERVE_MIN  # minutes billed after the last step, counted in every projection
    check_every_min: float = 30.0  # minutes between the guard's checks
    sidecar_interval_min: float = 5.0  # the sidecar's --interval-min; a reading older than 3 of them is stale
    unknown_grace_min: float = 60.0  # stop with a checkpoint once the spend has been unknown this long
    stop_wait_s: float = 120.0  # projected over the cap: the longest wait for a step boundary, then exit 4
    max_rate_usd_per_hr: float = 1.40  # the launch gate refuses a higher hourly rate (the lab's rule)
    fit: bool = False  # train.total_steps becomes an upper bound; the end follows the money (wsd)
    max_hours: float | None = None  # with fit: hours of wall clock from the run's first start (downtime too)
    expected_step_s: float | None = None  # measured seconds per step for the planned cost (else the GPU's peak)
    assumed_mfu: float = DEFAULT_MFU  # honest MFU for the planned cost when expected_step_s is not given


@dataclass(frozen=True, kw_only=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    spike: SpikeConfig = field(default_factory=SpikeConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def sha256(self) -> str:
        return config_sha256(self)

    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.model.seq_len


SECTIONS: dict[str, type] = dict(typing.get_type_hints(Config))


# --- strict loading ---------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> tuple[Any, str | None]:
    """Return (value, None) or (None, problem). Accepts ints for floats, and numeric strings for floats
    (PyYAML reads ``3e-4`` as a string)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None, None
        for a in args:
            if a is type(None):
                continue
            v, err = _coerce(value, a, key)
            if err is None:
                return v, None
        return None, f"{key}: expected {_type_name(tp)}, got {value!r}"
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value, None
        return None, f"{key}: {value!r} is not one of {', '.join(repr(c) for c in choices)}"
    if tp is bool:
        if isinstance(value, bool):
            return value, None
        return None, f"{key}: expected true or false, got {value!r}"
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        return None, f"{key}: expected an integer, got {value!r}"
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = float(value)
        elif isinstance(value, str):
            try:
                v = float(value)
            except ValueError:
                return None, f"{key}: expected a number, got {value!r}"
        else:
            return None, f"{key}: expected a number, got {value!r}"
        if not math.isfinite(v):
            return None, f"{key}: must be finite, got {value!r}"
        return v, None
    if tp is str:
        if isinstance(value, str):
            return value, None
        return None, f"{key}: expected a string, got {value!r}"
    raise TypeError(f"unsupported config field type {tp!r} for {key}")  # a bug in this file, not user input


def _section_from_dict(cls: type, data: Any, prefix: str, problems: list[str]) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.append(f"{prefix}: expected a mapping of keys, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}.{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {prefix}.{close[0]}?)" if close else f" (known: {', '.join(names)})"
            problems.append(f"{full}: unknown key{hint}")
            continue
        v, err = _coerce(value, hints[key], full)
        if err:
            problems.append(err)
        else:
            kwargs[key] = v
    return cls(**kwargs)


GPT2_VOCAB = 50257  # what model.vocab_size: auto means where no data is at hand (tokenize_data's default tokenizer)


def data_vocab(data_dir: str | Path | None) -> int | None:
    """The vocab size a ``tokenize_data`` output records, or None where it has none to read (the data check at
    launch then names what is missing)."""
    if data_dir is None:
        return None
    try:
        meta = json.loads((Path(data_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    v = meta.get("vocab_size") if isinstance(meta, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def from_dict(data: Any, source: str = "config", world_size: int = 1, vocab: int | None = None) -> Config:
    """A config from its sections; ``vocab`` is what ``model.vocab_size: auto`` becomes (the data's; GPT-2's
    50,257 when None)."""
    problems: list[str] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"top level: expected a mapping with sections {', '.join(SECTIONS)}"], source)
    sections: dict[str, Any] = {}
    for name, value in data.items():
        if name not in SECTIONS:
            close = difflib.get_close_matches(str(name), list(SECTIONS), n=1)
            hint = f" (did you mean {close[0]}?)" if close else f" (sections: {', '.join(SECTIONS)})"
            problems.append(f"{name}: unknown section{hint}")
            continue
        sections[name] = _section_from_dict(SECTIONS[name], value, name, problems)
    cfg = Config(**sections)
    if cfg.model.vocab_size == "auto":
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab or GPT2_VOCAB))
    problems.extend(validate(cfg, world_size))
    if problems:
        raise ConfigError(problems, source)
    return cfg


# Keys that moved: the old spelling is still read, for one release, with a one-line notice (old -> new).
RENAMED: dict[str, str] = {
    "train.ckpt_every": "checkpoint.every_steps",
    "train.ckpt_every_min": "checkpoint.every_min",
    "train.fit_to_budget": "budget.fit",
    "spike.warmup_steps": "spike.baseline_steps",
    "spike.skip_spike_steps": "spike.skip_steps",
}


def upgrade(
    data: dict[str, Any], notice: Callable[[str], None] | None = None, problems: list[str] | None = None
) -> dict[str, Any]:
    """``data`` (sections of keys) with every renamed key under its new name: a config file written before a
    rename, or the config a checkpoint recorded. ``notice`` is told of each; both spellings at once is a
    problem."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for old, new in RENAMED.items():
        old_s, old_k = old.split(".")
        section = out.get(old_s)
        if not isinstance(section, dict) or old_k not in section:
            continue
        value = section.pop(old_k)
        new_s, new_k = new.split(".")
        target = out.setdefault(new_s, {})
        if not isinstance(target, dict):
            continue
        if new_k in target and problems is not None:
            problems.append(f"{old}: renamed {new}, and both are set; keep {new} only")
        target.setdefault(new_k, value)
        if notice is not None:
            notice(f"{old} is now {new} (the old key is read for one release)")
    return out


def load(
    path: str | Path,
    overrides: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    world_size: int = 1,
    vocab: int | None = None,
) -> Config:
    """Load ``path``, apply flag ``overrides`` ({"train.total_steps": 100}) then ``--set`` strings;
    ``model.vocab_size: auto`` becomes ``vocab`` (the data's: :func:`data_vocab`; GPT-2's when None).

    ``train.grad_accum_steps`` is derived: batch_size / micro_batch_size micro-batches a step over all ranks
    (each of ``world_size`` ranks runs its share), so the global batch is the same on any number of ranks. A
    flag or ``--set`` that changes batch_size or micro_batch_size without grad_accum_steps drops the file's
    grad_accum_steps (it was the file's batch over the file's micro-batch)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError([f"cannot read the config file ({e.strerror})"], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {e}"], str(path)) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["top level: expected a mapping of sections"], str(path))
    problems: list[str] = []
    merged = upgrade(data, lambda m: _notice(f"{path}: {m}"), problems)
    items = list((overrides or {}).items())
    for s in sets or []:
        key, sep, raw = s.partition("=")
        if not sep or "." not in key:
            problems.append(f"--set {s!r}: expected section.key=value")
            continue
        items.append((key.strip(), yaml.safe_load(raw) if raw.strip() else raw))
    given = {RENAMED.get(k, k) for k, _ in items}
    train = merged.get("train")
    if (
        isinstance(train, dict)
        and given & {"train.batch_size", "train.micro_batch_size"}
        and "train.grad_accum_steps" not in given
    ):
        train.pop("grad_accum_steps", None)  # the file's value matched the file's batch and micro-batch
    for key, value in items:
        if key in RENAMED:
            _notice(f"--set {key}: {key} is now {RENAMED[key]} (the old key is read for one release)")
            key = RENAMED[key]
        section, _, name = key.partition(".")
        target = merged.setdefault(section, {})
        if not isinstance(target, dict):
            problems.append(f"{section}: expected a mapping of keys")
            continue
        target[name] = value
    if problems:
        raise ConfigError(problems, str(path))
    return from_dict(merged, str(path), world_size, vocab)


def config_sha256(cfg: Config) -> str:
    blob = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# Keys that change how a run is operated, not what it computes: a resume may change them freely.
OPERATIONAL_KEYS = frozenset(
    {
        "train.log_every",
        "train.eval_every",
        "train.eval_batches",
        "train.prefetch",
        "train.compile",
        "train.compile_mode",
        "train.device",
        "train.min_tokens_per_s",
        "train.throughput_window",
        "train.min_tokens_per_s_window_min",
        "train.min_tokens_per_s_always",
        "checkpoint.every_steps",
        "checkpoint.every_min",
        "checkpoint.keep_last",
        "checkpoint.async_save",
        "checkpoint.remote",
        "checkpoint.remote_wait_min",
        "spike.ema_alpha",
        "spike.baseline_steps",
        "spike.loss_sigma",
        "spike.min_loss_jump",
        "spike.grad_factor",
        "spike.grad_window",
        # how the same computation runs: the state fits either way (a change is logged; bitwise resume needs none)
        "train.fused_loss",
        "train.loss_chunk_tokens",
        "train.bf16_residual",
        "train.compile_scope",
        "train.deterministic",
        "train.sdpa_cudnn",
        "train.eval_tasks",
        "train.eval_tasks_every",
        "train.eval_tasks_limit",
        "train.eval_tasks_max_s",
        # how the global batch is cut: a step's sequences depend on batch_size, seed and seq_len only
        # (data.tokens.Sampler), so another micro-batch or rank count trains on the same data (float rounding apart)
        "train.micro_batch_size",
        "train.grad_accum_steps",
        # money: the cap, its lines and cadences may change between restarts (budget.fit changes the schedule: not here)
        *(f"budget.{f.name}" for f in dataclasses.fields(BudgetConfig) if f.name != "fit"),
    }
)


DEFAULTS: dict[str, Any] = flatten(dataclasses.asdict(Config()))
# Keys x1 gained later whose absence from an older checkpoint's config means another value than the default:
# a run from before vocabulary padding had none.
BEFORE_KEY_EXISTED: dict[str, Any] = {"model.vocab_pad_multiple": 1}


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Keys whose values differ between two config dicts, as (key, a, b); renamed keys are compared under their
    new names."""
    fa, fb = flatten(upgrade(a)), flatten(upgrade(b))
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
