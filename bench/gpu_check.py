"""Check a GPU before paying for a day of it, in one run of at most ~9 minutes, with numbers to trust.

    bash bench/gpu_check.sh [OUT.md]            # the wrapper: picks the Python, caps the wall time
    python bench/gpu_check.py --out OUT.md [--deadline-s 500] [--config configs/x1-50m-a100.yaml]

Phases, in this order; each but the first runs in its own process under its own deadline (a compile that
hangs, the lab's known failure, is reported instead of eating the rest; ``--phase-s NAME=SECONDS`` changes
one), writes what it has measured so far as it goes, and a phase that fails or times out does not stop the next:

  report        versions (torch, CUDA, cuDNN, triton, flash-attn) and the hardware; FAILS the whole check
                (exit 1) when nvidia-smi sees a GPU that torch cannot use
  trainer       THE REAL TRAINER CLI first (python -m x1_pretrain.train, the lab config, synthetic uint16 tokens,
                --trainer-steps steps) compiled in mode default, which compiles within its budget from a cold
                cache: warm tokens/s, MFU honest and lab 6N, first step (compile) time, peak memory, and the
                --budget-expected-step-s for the launch gate. The figures come from the trainer's progress file
                and MLflow store as it runs: a trainer stopped at the phase's deadline keeps the steps it finished
                (the report says it was cut)
  grads         a small model with gradient accumulation: the accumulated gradients of eager and of each
                compile mode x1 uses (default, max-autotune-no-cudagraphs) must agree
  graph-breaks  torch._dynamo.explain on the lab model with the kernels the trainer picks: graphs and breaks for
                the whole model and for one block (and for raw flash-attn, to show why it is swapped)
  bf16-vs-fp32  30 optimizer steps of the lab model on one fixed batch from one init: true fp32 (TF32 off), bf16
                autocast as configured, and bf16 with the bf16 residual stream; the bf16 curves must track fp32
  ab-eager      an A/B of each speed switch (vocab padding, one-pass loss, bf16 residual, fused projections,
                deterministic mode, flash-attn vs SDPA) at the lab micro-batch, eager, from one init
  optimizer-ab  AdamW (the config) against Muon (configs/x1-50m-muon.yaml's optimizer) at the lab's shapes: the
                same init, real text (--ab-data DIR, a tokenize_data output such as the lab's, else pydoc topics
                and the stdlib's sources) and batches; val loss at five points, seconds a step, and the step at
                which Muon reaches AdamW's final loss (bench/gpu_check_optim.py)
  ab-compiled   the same switches under torch.compile (mode default), while time is left
  profile       a short torch.profiler trace of the trainer's configuration: device time by group (GEMM,
                attention, loss, elementwise, optimizer, idle)
  trainer-lab-mode  the real trainer again in the config's own compile mode (the lab's max-autotune), if time
                is left: its compile time and whether its speed beats default's

Every phase compiles into the trainer's own Inductor cache (``$TORCHINDUCTOR_CACHE_DIR``, by default
``~/.cache/x1_pretrain/inductor``), so the paid run on the same machine starts with the kernels warm.

It writes OUT.md (also printed) and OUT.json beside it; child logs go to OUT.log. Exit 0 when every phase
passed, 1 otherwise. Without CUDA (and without a GPU for nvidia-smi) it says so and runs every phase on a tiny
config on the CPU, without compilation: a smoke test of the same code, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAB_CONFIG = REPO / "configs" / "x1-50m-a100.yaml"
VOCAB = 50257
# (phase, seconds at most) in the order they run; sized for one H100/H200, together under --deadline-s
# The real trainer first, compiled in mode default (it finishes in its budget from a cold cache); the config's own
# mode (the lab's max-autotune) last, if time is left. --phase-s NAME=SECONDS overrides one.
PHASES: list[tuple[str, float]] = [
    ("trainer", 150.0),
    ("grads", 50.0),
    ("graph-breaks", 25.0),
    ("bf16-vs-fp32", 40.0),
    ("ab-eager", 45.0),
    ("optimizer-ab", 40.0),
    ("ab-compiled", 45.0),
    ("profile", 25.0),
    ("trainer-lab-mode", 80.0),
]
# What each A/B variant flips, relative to the config as it is (``--set`` syntax)
SWITCHES: list[tuple[str, list[str]]] = [
    ("baseline (config as is)", []),
    ("vocab padding off", ["model.vocab_pad_multiple=1"]),
    ("one-pass loss off", ["train.fused_loss=false"]),
    ("bf16 residual on", ["train.bf16_residual=true"]),
    ("fused projections on", ["model.fused_projections=true"]),
    ("deterministic on", ["train.deterministic=true"]),
    ("SDPA instead of flash-attn", ["train.attention=sdpa"]),
    ("compile scope blocks", ["train.compile_scope=blocks"]),
]
EAGER_ONLY = {"SDPA instead of flash-attn"}
SMOKE_MEASURE_S, SMOKE_MAX_STEPS = 0.1, 2  # A/B timing in the CPU smoke: the code path, not a measurement
REPEAT_CHECK = {"baseline (config as is)", "deterministic on"}  # do two identical backward passes match bitwise?
COMPILED_ONLY = {"compile scope blocks"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _noop(_: str) -> None:
    return None


# --- models and steps ----------------------------------------------------------------------------------
# The CPU smoke's shapes (same code, small numbers), as --set overrides for both the in-process phases and the
# trainer CLI
TINY_SETS = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "model.n_kv_head=2",
    "model.d_ff=176",
    "model.seq_len=32",
    "train.micro_batch_size=2",
    "train.grad_accum_steps=2",
    "train.batch_size=4",
    "train.precision=fp32",
    "train.compile=false",
]


# The in-process phases of the smoke (not the real trainer, which keeps GPT-2's 50,257): a vocabulary that is not a
# multiple of 128 either, so the padding switch still pads, at a small fraction of the LM head's cost
SMOKE_VOCAB_SETS = ["model.vocab_size=2000"]


def load_config(path: Path, tiny: bool, sets: list[str] | None = None) -> Any:
    from x1_pretrain.core import config as C

    return C.load(path, sets=[*(sets or []), *(TINY_SETS + SMOKE_VOCAB_SETS if tiny else [])])


def small_config(cfg: Any, cuda: bool) -> Any:
    """The grads phase's model: the config's vocabulary and architecture, 2 narrow layers (64 wide in the CPU smoke),
    4-way accumulation."""
    m = dataclasses.replace(
        cfg.model,
        n_layer=2,
        d_model=256 if cuda else 64,
        n_head=4,
        n_kv_head=2,
        d_ff=688 if cuda else 176,
        seq_len=256 if cuda else 32,
    )
    t = dataclasses.replace(
        cfg.train,
        micro_batch_size=4 if cuda else 2,
        grad_accum_steps=4,
        batch_size=16 if cuda else 8,
        precision="bf16" if cuda else "fp32",
    )
    return dataclasses.replace(cfg, model=m, train=t)


def build(cfg: Any, device: Any, seed: int = 0) -> tuple[Any, Any]:
    """x1's model with the kernels the trainer would pick for ``cfg`` on ``device``, and its optimizer."""
    import torch

    from x1_pretrain.model.transformer import Transformer
    from x1_pretrain.trainer.device import forward_kernels, hardware_plan
    from x1_pretrain.trainer.optim import build_optimizer

    torch.manual_seed(seed)
    model = Transformer(cfg.model).to(device)
    model.set_kernels(forward_kernels(cfg, device, hardware_plan(cfg, device, _noop), _noop))
    return model, build_optimizer(model, cfg, device)


def autocast(cfg: Any, device: Any) -> Any:
    import torch

    if cfg.train.precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batches(cfg: Any, device: Any, n: int, seed: int = 1) -> list[Any]:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (cfg.train.micro_batch_size, cfg.model.seq_len + 1)
    return [torch.randint(0, cfg.model.vocab_size, shape, generator=gen).to(device) for _ in range(n)]


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def accumulate(forward: Any, cfg: Any, device: Any, ids: list[Any]) -> float:
    """One optimizer step's forward/backward over ``ids`` (the micro-batches); returns the mean loss."""
    total = 0.0
    for x in ids:
        with autocast(cfg, device):
            loss = forward(x[:, :-1], x[:, 1:])
        (loss / len(ids)).backward()
        total += float(loss.detach())
    return total / len(ids)


# --- phases --------------------------------------------------------------------------------------------
class Partial:
    """A phase's result, written to its file after every item so that a timeout keeps what was measured."""

    def __init__(self, path: Path | None, **data: Any) -> None:
        self.path, self.data = path, dict(data)

    def put(self, key: str, value: Any) -> None:
        from x1_pretrain.core.fileio import write_text_atomic

        self.data[key] = value
        if self.path is not None:
            write_text_atomic(self.path, json.dumps(self.data, default=str))


def phase_grads(cfg: Any, device: Any, out: Partial) -> None:
    """Accumulated gradients (4 micro-batches) of eager vs each compile mode, same init, same batches."""
    import torch

    from x1_pretrain.trainer.device import effective_compile_mode

    small = small_config(cfg, device.type == "cuda")
    ids = batches(small, device, small.train.grad_accum_steps)
    modes = ["eager"]
    if device.type == "cuda":
        lab_mode, _ = effective_compile_mode(cfg.train.compile_mode, small.train.grad_accum_steps)
        modes += sorted({"default", lab_mode})
    else:
        out.put("skipped", "compile modes on the CPU (a cold compile costs minutes here)")
    ref: list[Any] = []
    rows: list[dict[str, Any]] = []
    tol = 2e-2 if small.train.precision == "bf16" else 1e-5
    for mode in modes:
        torch._dynamo.reset()
        model, _ = build(small, device)
        forward = model if mode == "eager" else torch.compile(model, mode=mode)
        t0 = time.perf_counter()
        loss = accumulate(forward, small, device, ids)
        sync(device)
        grads = [p.grad.detach().float().clone() for p in model.parameters()]
        if mode == "eager":
            ref = grads
        rel = max(float((g - r).norm() / r.norm().clamp_min(1e-12)) for g, r in zip(grads, ref, strict=True))
        rows.append(
            {
                "mode": mode,
                "loss": loss,
                "max_rel_grad_diff": rel,
                "first_call_s": time.perf_counter() - t0,
                "ok": rel <= tol and math.isfinite(loss),
            }
        )
        out.put("rows", rows)
        del model, forward, grads
    out.put("tolerance", tol)
    out.put(
        "shape",
        f"{small.model.n_layer} layers x d_model {small.model.d_model}, micro-batch "
        f"{small.train.micro_batch_size} x {small.model.seq_len}, {small.train.grad_accum_steps} "
        f"micro-steps, {small.train.precision}",
    )
    out.put("ok", all(r["ok"] for r in rows))


def phase_graph_breaks(cfg: Any, device: Any, out: Partial) -> None:
    """Graphs and breaks for the compiled trainer's forward, the whole model and one block."""
    import torch

    from x1_pretrain.model.transformer import flash_available

    model, _ = build(cfg, device)
    x = batches(dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch_size=2)), device, 1)[0]
    rows = []

    def count(what: str, fn: Callable[..., Any], *args: Any) -> None:
        torch._dynamo.reset()
        with autocast(cfg, device):
            e = torch._dynamo.explain(fn)(*args)
        rows.append(
            {
                "what": what,
                "graphs": e.graph_count,
                "breaks": e.graph_break_count,
                "reasons": sorted({str(b.reason).splitlines()[0][:160] for b in e.break_reasons})[:5],
            }
        )
        out.put("rows", rows)

    attention = "flash-attn" if model.kernels.use_flash else "SDPA"
    if device.type == "cuda":
        out.put("sdpa_backends_for_gqa_bf16", sdpa_backends(device))
    count(f"whole model + loss ({attention})", model, x[:, :-1], x[:, 1:])
    h = torch.randn(2, cfg.model.seq_len, cfg.model.d_model, device=device)
    count(f"one block ({attention})", model.model.layers[0], h, model.rope_cos, model.rope_sin)
    if device.type == "cuda" and flash_available() and not model.kernels.use_flash:
        model.set_attention(True)  # what the compiled trainer avoids: raw flash-attn inside the graph
        count("whole model with raw flash-attn (not used under compile)", model, x[:, :-1], x[:, 1:])
    out.put("ok", rows[0]["breaks"] == 0 and rows[1]["breaks"] == 0)


def phase_bf16_vs_fp32(cfg: Any, device: Any, out: Partial) -> None:
    """The same init and fixed batch trained in true fp32, in bf16 autocast, and in bf16 with a bf16 residual."""
    import torch

    steps = 30 if device.type == "cuda" else 2
    fixed = dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, micro_batch_size=8 if device.type == "cuda" else 2, compile=False)
    )
    ids = batches(fixed, device, 1, seed=2)
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    curves: dict[str, list[float]] = {}
    try:
        for name, sets in (
            ("fp32", {"precision": "fp32"}),
            ("bf16", {"precision": "bf16"}),
            ("bf16 + bf16 residual", {"precision": "bf16", "bf16_residual": True}),
        ):
            run_cfg = dataclasses.replace(fixed, train=dataclasses.replace(fixed.train, **sets))
            model, opt = build(run_cfg, device)
            losses = []
            for _ in range(steps):
                losses.append(accumulate(model, run_cfg, device, ids))
                torch.nn.utils.clip_grad_norm_(model.parameters(), run_cfg.optim.grad_clip or float("inf"))
                opt.step()
                opt.zero_grad(set_to_none=True)
            curves[name] = losses
            out.put("curves", curves)
            del model, opt
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    ref = curves["fp32"]
    rows = []
    for name, losses in curves.items():
        rel = max(abs(a - b) / abs(a) for a, b in zip(ref, losses, strict=True))
        rows.append(
            {
                "run": name,
                "first": losses[0],
                "last": losses[-1],
                "max_rel_diff": rel,
                "final_abs_diff": abs(ref[-1] - losses[-1]),
                "ok": all(map(math.isfinite, losses)) and rel <= 0.02 and abs(ref[-1] - losses[-1]) <= 0.1,
            }
        )
    out.put("rows", rows)
    out.put("steps", steps)
    out.put("ok", all(r["ok"] for r in rows))


def synthetic_data(directory: Path, cfg: Any, train_tokens: int) -> None:
    """A tokenize_data-shaped directory of random uint16 ids (the trainer's data path, not a model of text)."""
    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    val_tokens = max(cfg.train.eval_batches * cfg.train.micro_batch_size * (cfg.model.seq_len + 1) * 2, 4096)
    eot = cfg.model.vocab_size - 1
    for split, n in (("train", train_tokens), ("val", val_tokens)):
        ids = rng.integers(0, eot, n, dtype=np.uint16)
        ids[np.cumsum(rng.integers(200, 2000, n // 200 + 1))[:-1].clip(max=n - 1)] = eot  # "documents" end with EOT
        ids.tofile(directory / f"{split}.bin")
    meta = {
        "vocab_size": cfg.model.vocab_size,
        "dtype": "uint16",
        "eot_id": eot,
        "splits": {"train": {"tokens": train_tokens}, "val": {"tokens": val_tokens}},
        "note": "synthetic ids written by bench/gpu_check.py",
    }
    (directory / "meta.json").write_text(json.dumps(meta))


def read_mlflow_file_store(store: Path) -> tuple[dict[str, float], dict[str, str]]:
    """The last value of every metric and every tag of the one run in a file:// MLflow store."""
    metrics: dict[str, float] = {}
    tags: dict[str, str] = {}
    for run in store.glob("*/*/metrics"):
        for f in run.rglob("*"):
            lines = f.read_text().split("\n") if f.is_file() else []
            last = [ln for ln in lines if ln.strip()]
            if last:
                metrics[str(f.relative_to(run))] = float(last[-1].split()[1])
        for f in (run.parent / "tags").rglob("*"):
            if f.is_file():
                tags[str(f.relative_to(run.parent / "tags"))] = f.read_text()
    return metrics, tags


def trainer_sets(smoke: bool) -> list[str]:
    """--set overrides of the trainer phase: no eval or checkpoint in the timed steps, no budget guard (no billing
    sidecar runs during the check); the smoke's tiny shapes."""
    sets = [
        "train.eval_every=100000",
        "train.eval_batches=2",
        "checkpoint.every_steps=100000",
        "train.log_every=5",
        "budget.cap_usd=null",
    ]
    return sets + TINY_SETS if smoke else sets


TRAINER_READ_MARGIN_S = 12.0  # of a trainer phase's deadline: to stop the trainer and read what it measured
TRAINER_WARM_STEP = 3  # progress before this step includes the compilation: not a speed


def trainer_figures(
    samples: list[tuple[int, float]],
    tokens_per_step: int,
    flops_honest: int,
    flops_lab: int,
    peak_tflops: float | None,
    last_step: int | None = None,
) -> dict[str, Any]:
    """Warm speed from the trainer's progress file, as (step, unix time) samples: the steps between the first
    warm sample and the last over the time between them; MFU in both accountings where the peak is known, and
    the step time the launch gate takes (--budget-expected-step-s). Empty without two warm samples. The run's
    ``last_step`` is left out where there is enough without it: its record may come after the final val loss
    and checkpoint."""
    warm = sorted({s: t for s, t in samples if s >= TRAINER_WARM_STEP}.items())
    if len(warm) >= 3 and warm[-1][0] == last_step:
        warm = warm[:-1]
    if len(warm) < 2 or warm[-1][1] <= warm[0][1]:
        return {}
    step_s = (warm[-1][1] - warm[0][1]) / (warm[-1][0] - warm[0][0])
    tps = tokens_per_step / step_s
    out: dict[str, Any] = {"tokens_per_s": tps, "step_s": step_s, "warm_steps": warm[-1][0] - warm[0][0]}
    if peak_tflops:
        out["mfu"] = tps * flops_honest / (peak_tflops * 1e12)
        out["mfu_lab_6n"] = tps * flops_lab / (peak_tflops * 1e12)
    return out


def _read_progress(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the trainer's process group (its compile workers too), SIGKILL after a few seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=8)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def watch_trainer(
    proc: subprocess.Popen[Any], progress: Path, deadline: float, cut_after_steps: int | None, out: Partial
) -> tuple[list[tuple[int, float]], str | None]:
    """Follow the trainer's progress file until it exits, or stop it at ``deadline`` (or, for tests, once it
    reports ``cut_after_steps`` steps): (the (step, time) samples seen, why it was cut or None)."""
    samples: list[tuple[int, float]] = []
    cut = None
    while True:
        done = proc.poll() is not None
        p = _read_progress(progress)
        if p and isinstance(p.get("step"), int) and (not samples or p["step"] != samples[-1][0]):
            samples.append((p["step"], float(p["time_unix"])))
            out.put("progress", {"samples": samples, "first_step_s": p.get("first_step_s")})
        if done:
            return samples, cut
        if time.monotonic() > deadline:
            cut = "its deadline"
        elif (
            cut_after_steps is not None
            and samples
            and samples[-1][0] >= cut_after_steps
            and sum(st >= TRAINER_WARM_STEP for st, _ in samples) >= 2
        ):
            cut = f"--cut-after-steps {cut_after_steps}"
        if cut:
            _stop_group(proc)
            return samples, cut
        time.sleep(0.2)


def phase_trainer(args: argparse.Namespace, device: Any, out: Partial, lab_mode: bool = False) -> None:
    """The real trainer CLI on synthetic tokens; what the paid run will see. Its figures come from what it
    wrote while it ran (the progress file, its MLflow store), so a run stopped at the phase's deadline keeps
    the steps it finished. Compiled in mode ``default`` (it compiles within its budget from a cold cache), or with
    ``lab_mode`` in the config's own mode (the lab's max-autotune, with its compile time)."""
    from x1_pretrain.model import flops

    smoke = device.type != "cuda"
    steps = args.trainer_steps or (6 if smoke else 25)
    sets = trainer_sets(smoke) + ([] if lab_mode else ["train.compile_mode=default"])
    cfg = load_config(args.config, tiny=False, sets=sets)
    if lab_mode and cfg.train.compile_mode == "default":
        out.put("ok", True)
        out.put("skipped", "the config's compile mode is default: measured by the trainer phase already")
        return
    # under the orchestrator's scratch dir (X1_GPU_CHECK_TMP), which it removes even when this phase is killed
    work = Path(tempfile.mkdtemp(prefix="x1-gpu-check-trainer-", dir=os.environ.get("X1_GPU_CHECK_TMP")))
    t0 = time.monotonic()
    try:
        # two passes' worth of ids, within [1 Mi, 64 Mi] tokens: a longer run wraps around (synthetic anyway)
        synthetic_data(work / "data", cfg, min(max((steps + 1) * cfg.tokens_per_step() * 2, 1 << 20), 1 << 26))
        cmd = [
            sys.executable,
            "-m",
            "x1_pretrain.train",
            "--config",
            str(args.config),
            "--data-dir",
            str(work / "data"),
            "--ckpt-dir",
            str(work / "ckpt"),
            "--mlflow-uri",
            (work / "mlruns").as_uri(),
            "--total-steps",
            str(steps),
        ] + [a for s in sets for a in ("--set", s)]
        out.put("command", " ".join(cmd))
        out.put("steps", steps)
        out.put("tokens_per_step", cfg.tokens_per_step())
        env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true", "PYTHONPATH": str(REPO / "src")}
        with open(work / "trainer.log", "w") as log:
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
            )
            # the phase's budget counts from its process's start (its imports included), as the orchestrator's
            started = getattr(args, "started_unix", None) or time.time()
            left = started + args.phase_budget_s - TRAINER_READ_MARGIN_S - time.time()
            samples, cut = watch_trainer(
                proc, work / "ckpt" / "progress.json", t0 + max(left, 1.0), args.cut_after_steps, out
            )
        out.put("wall_s", time.monotonic() - t0)
        print((work / "trainer.log").read_text(errors="replace")[-8000:], flush=True)
        metrics, tags = read_mlflow_file_store(work / "mlruns")
        keep = (
            "train/tokens_per_s",
            "train/mfu",
            "train/mfu_lab_6n",
            "train/step_time_s",
            "train/peak_mem_gib",
            "train/first_step_s",
            "train/loss",
        )
        out.put("metrics", {k: metrics[k] for k in keep if k in metrics})
        out.put(
            "tags",
            {
                k: v
                for k, v in tags.items()
                if k in ("compile_mode_effective", "attention_effective", "kernels", "compile_fallback")
            },
        )
        fpt = flops.flops_per_token(cfg.model)
        peak = flops.peak_tflops(torch_device_name(device))
        figures = trainer_figures(samples, cfg.tokens_per_step(), fpt.honest, fpt.lab_6n, peak, steps)
        first = (_read_progress(work / "ckpt" / "progress.json") or {}).get("first_step_s")
        out.put("figures", {**figures, "first_step_s": first, "steps_done": samples[-1][0] if samples else 0})
        out.put("cut", cut)
        out.put("exit_code", proc.returncode if cut is None else None)
        # a finished run has the trainer's own figures even if the progress file was read too rarely for a speed
        measured = bool(figures) or (cut is None and "train/tokens_per_s" in metrics)
        ok = measured and "compile_fallback" not in tags and (cut is not None or proc.returncode == 0)
        out.put("ok", ok)
        if not ok:
            out.put(
                "why",
                "the trainer fell back to eager: " + tags["compile_fallback"][:200]
                if "compile_fallback" in tags
                else f"the trainer exited {proc.returncode}"
                if cut is None and proc.returncode != 0
                else f"cut by {cut} before two warm progress records (step >= {TRAINER_WARM_STEP})",
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def torch_device_name(device: Any) -> str | None:
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def time_micro_steps(
    forward: Any, optimizer: Any, cfg: Any, device: Any, measure_s: float, max_steps: int
) -> dict[str, Any]:
    """Warm micro-steps at the config's micro-batch (an optimizer step every grad_accum_steps)."""
    import torch

    accum = cfg.train.grad_accum_steps
    ids = batches(cfg, device, 2)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    first_loss, first_s = math.nan, math.nan
    t0 = start = time.perf_counter()
    steps = 0
    for i in range(max_steps + 2):
        if i == 2:
            sync(device)
            t0, steps = time.perf_counter(), 0
            first_s = t0 - start  # the two warm micro-steps: compilation included
        with autocast(cfg, device):
            loss = forward(ids[i % 2][:, :-1], ids[i % 2][:, 1:])
        (loss / accum).backward()
        if i == 0:
            first_loss = float(loss.detach())
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        steps += i >= 2
        if i >= 2 and steps % 4 == 0:
            sync(device)
            if time.perf_counter() - t0 > measure_s:
                break
    sync(device)
    elapsed = time.perf_counter() - t0
    tokens = steps * cfg.train.micro_batch_size * cfg.model.seq_len
    return {
        "micro_steps": steps,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else math.nan,
        "first_loss": first_loss,
        "first_s": first_s,
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else math.nan,
    }


def grads_repeat(forward: Any, model: Any, cfg: Any, device: Any) -> bool:
    """Two backward passes of the same weights on the same batches: bitwise the same gradients?"""
    ids = batches(cfg, device, 2, seed=3)
    runs = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        accumulate(forward, cfg, device, ids)
        runs.append([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return all(a.equal(b) for a, b in zip(*runs, strict=True))


def phase_ab(args: argparse.Namespace, device: Any, out: Partial, compiled: bool) -> None:
    """Each switch flipped alone against the config as it is, same init, same batches, in one process; a
    variant that would not finish within the phase's budget (its compile measured on the baseline) is skipped."""
    import torch

    from x1_pretrain.trainer.device import compile_model, make_deterministic, undo_deterministic

    tiny = device.type != "cuda"
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    out.put("mode", "compile default" if compiled else "eager")
    for name, sets in SWITCHES:
        if name in (EAGER_ONLY if compiled else COMPILED_ONLY):
            continue
        cost = rows[0]["first_s"] + args.measure_s + 5.0 if rows else 0.0
        if rows and time.monotonic() - started + cost > args.phase_budget_s:
            rows.append({"variant": name, "skipped": "no time left in this phase"})
            out.put("rows", rows)
            continue
        cfg = load_config(args.config, tiny, [*sets, f"train.compile={'true' if compiled else 'false'}"])
        if cfg.train.deterministic:
            make_deterministic(device, _noop)
        torch._dynamo.reset()
        model, opt = build(cfg, device)
        attention = "flash-attn" if model.kernels.use_flash else "SDPA"
        if name.startswith("SDPA") and rows and rows[0]["attention"] == "SDPA":
            rows.append({"variant": name, "skipped": "the baseline already runs SDPA"})
            continue
        forward = compile_model(model, model, "default", cfg.train.compile_scope, print) if compiled else model
        row = {
            "variant": name,
            "attention": attention,
            **time_micro_steps(forward, opt, cfg, device, args.measure_s, args.max_steps),
        }
        if name in REPEAT_CHECK:
            row["repeatable"] = grads_repeat(forward, model, cfg, device)
        row["compile_failed"] = getattr(forward, "failed", None)  # a fallback measures eager, not compiled
        undo_deterministic()
        base = rows[0] if rows else row
        row["speed_vs_baseline"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["loss_diff_vs_baseline"] = abs(row["first_loss"] - base["first_loss"])
        rows.append(row)
        out.put("rows", rows)
        del model, opt, forward
        if device.type == "cuda":
            torch.cuda.empty_cache()
    timed = [r for r in rows if "skipped" not in r]
    not_repeatable = [r["variant"] for r in timed if r.get("repeatable") is False and "deterministic" in r["variant"]]
    bad = [
        r["variant"]
        for r in timed
        if r["compile_failed"] or not math.isfinite(r["tokens_per_s"]) or r["loss_diff_vs_baseline"] >= 0.1
    ] + not_repeatable
    out.put("ok", bool(timed) and not bad)
    if bad:
        out.put("why", f"variants that failed (compile fallback, NaN, diverging loss or not repeatable): {bad}")


_GROUPS = [
    ("attention", r"flash|fmha|attention|sdpa|attn"),  # before GEMM: attention kernels are cutlass templates
    ("GEMM", r"gemm|sm\d\d_xmma|cublas|\bmm\b|addmm|bmm|matmul|linear|nvjet|_mm_"),
    ("loss", r"logsumexp|log_softmax|nll|cross_entropy|index_put|gather|scatter"),
    ("optimizer", r"adam|foreach|multi_tensor|_amp_|clip|norm_kernel"),
]


def kernel_group(name: str) -> str:
    low = name.lower()
    for group, pattern in _GROUPS:
        if re.search(pattern, low):
            return group
    return "elementwise/other"


def phase_profile(args: argparse.Namespace, cfg: Any, device: Any, out: Partial) -> None:
    """Device time (CPU op time on a CPU) of one optimizer step of the trainer's configuration, by group."""
    from torch.profiler import ProfilerActivity, profile

    from x1_pretrain.trainer.device import compile_model, effective_compile_mode

    model, opt = build(cfg, device)
    forward: Any = model
    if cfg.train.compile:
        mode, _ = effective_compile_mode("default", cfg.train.grad_accum_steps)
        forward = compile_model(model, model, mode, cfg.train.compile_scope, print)
    time_micro_steps(forward, opt, cfg, device, measure_s=1.0, max_steps=max(2, cfg.train.grad_accum_steps))
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        accumulate(forward, cfg, device, batches(cfg, device, cfg.train.grad_accum_steps))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
    wall_ms = (time.perf_counter() - t0) * 1e3
    groups: dict[str, float] = {}
    for evt in prof.key_averages():
        if cuda:
            t = getattr(evt, "self_device_time_total", None)
            t = getattr(evt, "self_cuda_time_total", 0.0) if t is None else t
            if getattr(evt, "device_type", None) is not None and "CUDA" not in str(evt.device_type):
                continue
        else:
            t = evt.self_cpu_time_total if evt.key.startswith("aten::") else 0.0
        if t:
            groups[kernel_group(evt.key)] = groups.get(kernel_group(evt.key), 0.0) + t / 1e3
    busy = sum(groups.values())
    groups["idle (wall - busy)"] = max(wall_ms - busy, 0.0)
    out.put("compile_failed", getattr(forward, "failed", None))
    out.put("wall_ms", wall_ms)
    out.put("groups_ms", dict(sorted(groups.items(), key=lambda kv: -kv[1])))
    out.put(
        "what",
        f"one optimizer step ({cfg.train.grad_accum_steps} micro-steps of "
        f"{cfg.train.micro_batch_size} x {cfg.model.seq_len}), "
        + ("device kernel time" if cuda else "CPU time of aten ops")
        + ", after 2+ warm micro-steps",
    )
    out.put("ok", busy > 0 and not out.data["compile_failed"])


# --- the report ----------------------------------------------------------------------------------------
def report(device: Any) -> dict[str, Any]:
    import torch

    from x1_pretrain import __version__
    from x1_pretrain.model.transformer import flash_available, flash_compiles

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda (torch build)": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton") or _version("pytorch-triton"),
        "flash-attn": (_version("flash-attn") or _version("flash_attn") or "not installed")
        + ("" if flash_available() else " (not importable)" if _version("flash-attn") else "")
        + (", a torch custom op (compiles without breaks)" if flash_compiles() else ""),
        "x1_pretrain": __version__,
    }
    if device.type != "cuda":
        info["GPU"] = "none: no CUDA GPU detected (torch.cuda.is_available() is False)"
        info["attention kernel"] = "SDPA on the CPU (flash-attn needs CUDA)"
        return info
    # properties only: the orchestrator makes no CUDA context (a GPU in exclusive-process mode stays the phases')
    props = torch.cuda.get_device_properties(device)
    info["GPU"] = (
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}, "
        f"{props.multi_processor_count} SMs"
    )
    info["driver"] = _nvidia_smi(["--query-gpu=driver_version", "--format=csv,noheader"])
    info["bf16 (sm_80 or newer)"] = (props.major, props.minor) >= (8, 0)
    return info


def sdpa_backends(device: Any) -> list[str]:
    """Which SDPA backends run x1's SDPA path for (B, T, H=12, hd=64) queries with 4 KV heads in bf16."""
    import torch

    from x1_pretrain.model.transformer import causal_attention

    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return []
    q = torch.randn(2, 256, 12, 64, device=device, dtype=torch.bfloat16)
    k = torch.randn(2, 256, 4, 64, device=device, dtype=torch.bfloat16)
    ok = []
    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue
        try:
            with warnings.catch_warnings(), sdpa_kernel([backend]):
                warnings.simplefilter("ignore")  # each refusing backend explains itself at length
                causal_attention(q, k, k, use_flash=False)
            torch.cuda.synchronize()
            ok.append(name.lower())
        except RuntimeError:
            continue
    return ok


def _nvidia_smi(args: list[str]) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def gpus_seen_by_driver() -> list[str]:
    listing = _nvidia_smi(["-L"]) or ""
    return [ln.strip() for ln in listing.splitlines() if ln.strip().startswith("GPU ")]


# --- orchestration -------------------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    phase: str
    status: str  # ok | FAILED: ... | timed out ... | skipped: ...
    data: dict[str, Any]
    wall_s: float


def run_child(phase: str, args: argparse.Namespace, timeout_s: float, log: Path, env: dict[str, str]) -> Result:
    """One phase in a fresh process (own session, so a timeout kills its compile workers too)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_file = Path(f.name)
    result_file.unlink()
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--phase",
        phase,
        "--config",
        str(args.config),
        "--max-steps",
        str(args.max_steps),
        "--measure-s",
        str(args.measure_s),
        "--trainer-steps",
        str(args.trainer_steps),
        "--phase-budget-s",
        f"{max(timeout_s - 10.0, 5.0):.0f}",
        "--result-file",
        str(result_file),
        "--started-unix",
        f"{time.time():.3f}",
    ] + (["--cut-after-steps", str(args.cut_after_steps)] if args.cut_after_steps else [])
    cmd += ["--ab-data", str(args.ab_data)] if args.ab_data else []
    t0 = time.monotonic()
    with open(log, "a") as logf:
        logf.write(f"\n===== {phase} (at most {timeout_s:.0f} s) =====\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    wall = time.monotonic() - t0
    try:
        data = json.loads(result_file.read_text())
    except (OSError, json.JSONDecodeError):
        data = {}
    result_file.unlink(missing_ok=True)
    if code is None:
        status = f"timed out after {timeout_s:.0f} s (partial results kept)"
    elif code != 0:
        status = f"FAILED (exit {code}): {_last_error(log)}"
    else:
        status = phase_status(data, "ok")
    return Result(phase, status, data, wall)


def phase_status(data: dict[str, Any], ok: str) -> str:
    """A finished phase's status: ``ok``, or FAILED with why; a trainer stopped at its deadline says so."""
    cut = ""
    if data.get("cut"):
        fig = data.get("figures", {})
        cut = f"cut by {data['cut']} after {fig.get('steps_done', 0)} of {data.get('steps', '?')} steps"
    if not data.get("ok"):
        return "FAILED: " + (data.get("why") or "a check did not pass (see the table)") + (f" ({cut})" if cut else "")
    return f"{ok} ({cut}; figures from those)" if cut else ok


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[:160]
    return lines[-1][:160] if lines else "no output"


def run_in_process(phase: str, args: argparse.Namespace, device: Any) -> Result:
    """The CPU smoke: the same phase functions, in this process."""
    out = Partial(None)
    t0 = time.monotonic()
    try:
        run_phase(phase, args, device, out)
        status = phase_status(out.data, "ok (smoke)")
    except Exception as e:  # a smoke failure is a bug in this code: report it, go on
        status = f"FAILED: {type(e).__name__}: {e}"
    return Result(phase, status, out.data, time.monotonic() - t0)


def run_phase(phase: str, args: argparse.Namespace, device: Any, out: Partial) -> None:
    cfg = load_config(args.config, tiny=device.type != "cuda")
    if phase == "grads":
        phase_grads(cfg, device, out)
    elif phase == "graph-breaks":
        phase_graph_breaks(cfg, device, out)
    elif phase == "bf16-vs-fp32":
        phase_bf16_vs_fp32(cfg, device, out)
    elif phase in ("trainer", "trainer-lab-mode"):
        phase_trainer(args, device, out, lab_mode=phase == "trainer-lab-mode")
    elif phase in ("ab-eager", "ab-compiled"):
        phase_ab(args, device, out, compiled=phase == "ab-compiled")
    elif phase == "profile":
        phase_profile(args, cfg, device, out)
    elif phase == "optimizer-ab":
        from gpu_check_optim import phase_optimizer_ab  # bench/ is the script's directory

        phase_optimizer_ab(args, device, out)
    else:
        raise ValueError(f"unknown phase {phase}")


def timing_defaults(args: argparse.Namespace, cuda: bool) -> None:
    """--measure-s and --max-steps where not given: the CPU smoke runs the same code on a few steps (it measures
    nothing)."""
    if args.measure_s is None:
        args.measure_s = 3.0 if cuda else SMOKE_MEASURE_S
    if args.max_steps is None:
        args.max_steps = 48 if cuda else SMOKE_MAX_STEPS


def orchestrate(args: argparse.Namespace) -> int:
    import torch

    started = time.monotonic()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    timing_defaults(args, cuda)
    info = report(device)
    driver_gpus = gpus_seen_by_driver()
    for k, v in info.items():
        print(f"[gpu_check]   {k}: {v}", flush=True)
    results: list[Result] = []
    if driver_gpus and not cuda:
        why = (
            f"nvidia-smi sees {len(driver_gpus)} GPU(s) ({driver_gpus[0]}) but torch {torch.__version__} cannot use "
            f"them (CUDA build {torch.version.cuda}): a CPU-only torch, a driver older than the CUDA build, or "
            "CUDA_VISIBLE_DEVICES hiding them. Fix this before paying for training."
        )
        print(f"[gpu_check] FAIL: {why}", flush=True)
        results.append(Result("report", f"FAILED: {why}", {"nvidia-smi": driver_gpus}, 0.0))
        return finish(args, info, results, cuda, started)
    results.append(Result("report", "ok", {}, time.monotonic() - started))
    if not cuda:
        print("[gpu_check] no GPU detected: a CPU smoke test of every phase on a tiny config", flush=True)
        for phase, limit in phase_limits(args):
            args.phase_budget_s = limit
            if phase in ("ab-compiled", "trainer-lab-mode"):
                results.append(Result(phase, "skipped: no compilation on the CPU smoke", {}, 0.0))
                continue
            results.append(run_in_process(phase, args, device))
            print(f"[gpu_check] {phase}: {results[-1].status}", flush=True)
        print("[gpu_check] CPU smoke run finished", flush=True)
        return finish(args, info, results, cuda, started)
    log = args.out.with_suffix(".log") if args.out else Path(tempfile.gettempdir()) / "x1-gpu-check.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    scratch = Path(tempfile.mkdtemp(prefix="x1-gpu-check-"))
    # the trainer's own Inductor cache (trainer/device.py): what the phases compile, the paid run finds warm
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir(),
        "X1_GPU_CHECK_TMP": str(scratch),
        "PYTHONPATH": str(REPO / "src"),
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"),
    }
    for phase, limit in phase_limits(args):
        left = args.deadline_s - (time.monotonic() - started) - 5.0
        if left < 15:
            results.append(Result(phase, "skipped: --deadline-s reached", {}, 0.0))
            continue
        print(f"[gpu_check] {phase} (at most {min(limit, left):.0f} s) ...", flush=True)
        results.append(run_child(phase, args, min(limit, left), log, env))
        print(f"[gpu_check]   {results[-1].status} in {results[-1].wall_s:.0f} s", flush=True)
        write_outputs(args, info, results, cuda, started)
    print(f"[gpu_check] child logs: {log}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return finish(args, info, results, cuda, started)


def phase_limits(args: argparse.Namespace) -> list[tuple[str, float]]:
    """PHASES with the --phase-s overrides."""
    return [(name, args.phase_s.get(name, limit)) for name, limit in PHASES]


def inductor_cache_dir() -> str:
    from x1_pretrain.trainer.device import inductor_cache

    return str(inductor_cache())


def finish(args: argparse.Namespace, info: dict[str, Any], results: list[Result], cuda: bool, started: float) -> int:
    table = write_outputs(args, info, results, cuda, started)
    print(table, flush=True)
    cut = [r.phase for r in results if "cut by" in r.status or r.status.startswith("timed out")]
    if cut:
        print(
            f"[gpu_check] phases cut by their deadline (what they measured is kept): {', '.join(cut)}; give them "
            "more with --phase-s NAME=SECONDS",
            flush=True,
        )
    if args.out:
        print(f"[gpu_check] written: {args.out} and {args.out.with_suffix('.json')}", flush=True)
    failed = [r.phase for r in results if r.status.startswith(("FAILED", "timed out"))]
    if failed:
        print(f"[gpu_check] phases that did not pass: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


def write_outputs(
    args: argparse.Namespace, info: dict[str, Any], results: list[Result], cuda: bool, started: float
) -> str:
    from gpu_check_report import markdown

    total = time.monotonic() - started
    table = markdown(info, results, not cuda, total)
    if args.out is not None:
        blob = {
            "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "smoke": not cuda,
            "total_s": total,
            "info": info,
            "phases": [dataclasses.asdict(r) for r in results],
        }
        _write(args.out, table)
        _write(args.out.with_suffix(".json"), json.dumps(blob, indent=2, default=str))
    return table


def _write(out: Path, text: str) -> None:
    from x1_pretrain.core.fileio import write_text_atomic

    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, text)


def child(args: argparse.Namespace) -> int:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timing_defaults(args, device.type == "cuda")
    out = Partial(args.result_file)
    run_phase(args.phase, args, device, out)
    print(json.dumps(out.data, default=str)[:4000], flush=True)
    return 0


def parse_phase_s(items: list[str]) -> dict[str, float]:
    names = [n for n, _ in PHASES]
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if name not in names or not seconds > 0:
            raise ValueError(f"{item!r} is not NAME=SECONDS with NAME one of {', '.join(names)} and SECONDS > 0")
        out[name] = seconds
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="markdown report to write (also printed); the JSON goes beside it")
    p.add_argument("--config", type=Path, default=LAB_CONFIG, help="model/optimizer config (default: the lab's)")
    p.add_argument("--deadline-s", type=float, default=500.0, help="wall-clock budget for all phases")
    p.add_argument(
        "--max-steps",
        type=int,
        help=f"timed micro-steps per A/B variant at most (default 48; {SMOKE_MAX_STEPS} in the CPU smoke)",
    )
    p.add_argument(
        "--measure-s",
        type=float,
        help=f"timed seconds per A/B variant at most (default 3; {SMOKE_MEASURE_S:g} in the CPU smoke)",
    )
    p.add_argument(
        "--trainer-steps",
        type=int,
        default=0,
        help="optimizer steps of the real trainer phase (default 25 on a GPU, 6 in the CPU smoke)",
    )
    p.add_argument(
        "--phase-s",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="a phase's deadline instead of its default (repeatable): " + ", ".join(f"{n}={s:g}" for n, s in PHASES),
    )
    p.add_argument(
        "--ab-data",
        type=Path,
        help="a tokenize_data output dir (the lab's) for the optimizer A/B; default: pydoc topics + stdlib sources",
    )
    p.add_argument("--cut-after-steps", type=int, help=argparse.SUPPRESS)  # tests: cut the trainer at a step
    p.add_argument("--started-unix", type=float, help=argparse.SUPPRESS)  # when the orchestrator started it
    p.add_argument("--phase", default="all", help=argparse.SUPPRESS)
    p.add_argument("--phase-budget-s", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.phase_s = parse_phase_s(args.phase_s)
    except ValueError as e:
        print(f"error: --phase-s: {e}", file=sys.stderr)
        return 2
    if not args.config.is_file():
        print(
            f"error: --config {args.config}: no such file (run from the x1 checkout, or pass --config)", file=sys.stderr
        )
        return 2
    if args.ab_data is not None and not (args.ab_data / "meta.json").is_file():
        print(
            f"error: --ab-data {args.ab_data}: no meta.json there; give a python -m x1_pretrain.tokenize_data "
            "output directory",
            file=sys.stderr,
        )
        return 2
    if args.out is not None and args.out.suffix != ".md":
        args.out = args.out / "gpu_check.md" if args.out.is_dir() else args.out.with_suffix(".md")
    return orchestrate(args) if args.phase == "all" else child(args)


if __name__ == "__main__":
    raise SystemExit(main())
