"""Check a GPU before paying for a day of it: versions, attention kernel, measured throughput, bf16 sanity.

    bash bench/gpu_check.sh [OUT.md]            # the wrapper: picks the Python, caps the wall time
    python bench/gpu_check.py --out OUT.md [--deadline-s 420] [--config configs/x1-50m-a100.yaml]

On a CUDA machine, in this order, each phase in its own process under a timeout (a compile that hangs,
the lab's known failure, is reported instead of eating the budget), all within --deadline-s:

  report        GPU, driver, torch / CUDA / cuDNN / triton / flash-attn versions; which attention kernel
                x1 uses (flash-attn, or the SDPA backends that accept the lab's GQA shapes)
  bf16-vs-fp32  50 optimizer steps on one fixed synthetic batch from the same init, bf16 autocast vs true
                fp32 (TF32 off): the bf16 loss must track the fp32 one
  eager / compile default / compile max-autotune
                the lab config (micro-batch 32 x 1024 tokens, grad accumulation as configured) on random
                token ids in [0, 50257) generated on the device, bf16 autocast, x1's Transformer and
                optimizer: tokens/s, MFU in the honest accounting and the lab's 6N one, peak memory, and
                the first step's time (compilation)

Timed micro-steps stop at --max-steps or after --measure-s seconds, whichever comes first; the table says
how many ran. Without CUDA it says so, reports versions, runs the same code paths for 2 steps on a tiny
config on the CPU (a smoke test, not a measurement) and exits 0. The markdown table goes to --out (and
stdout); child logs to OUT.log.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAB_CONFIG = REPO / "configs" / "x1-50m-a100.yaml"
VOCAB = 50257
# (phase, compile mode, timeout s) in the order they run, sized for one H100/H200; --deadline-s caps the sum
GPU_PHASES: list[tuple[str, str, float]] = [
    ("bf16-vs-fp32", "none", 75.0),
    ("throughput", "none", 75.0),
    ("throughput", "default", 120.0),
    ("throughput", "max-autotune", 300.0),  # last: gets what is left of --deadline-s
]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- what the phases measure -------------------------------------------------------------------------
def load_config(path: Path, tiny: bool) -> Any:
    from x1_pretrain.core import config as C

    cfg = C.load(path)
    if tiny:  # the CPU smoke: same code, small numbers
        small = dataclasses.replace(cfg.model, n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=176, seq_len=32)
        train = dataclasses.replace(cfg.train, micro_batch_size=2, grad_accum_steps=1, batch_size=2)
        cfg = dataclasses.replace(cfg, model=small, train=train)
    return cfg


def build(cfg: Any, device: Any, use_flash: bool, seed: int = 0) -> tuple[Any, Any]:
    import torch

    from x1_pretrain.model.transformer import Transformer
    from x1_pretrain.training.optim import build_optimizer

    torch.manual_seed(seed)
    model = Transformer(cfg.model).to(device)
    model.set_attention(use_flash)
    return model, build_optimizer(model, cfg, device)


def throughput(cfg: Any, device: Any, compile_mode: str, max_steps: int, measure_s: float,
               warmup: int = 3) -> dict[str, Any]:
    """Micro-steps of the lab's training step on random ids; an optimizer step every grad_accum micro-steps."""
    import torch

    from x1_pretrain.model import flops
    from x1_pretrain.model.transformer import flash_available

    cuda = device.type == "cuda"
    use_flash = cuda and flash_available()
    model, opt = build(cfg, device, use_flash)
    forward = torch.compile(model, mode=compile_mode) if compile_mode != "none" else model
    B, T, accum = cfg.train.micro_batch_size, cfg.model.seq_len, cfg.train.grad_accum_steps
    gen = torch.Generator(device=device).manual_seed(1)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def micro_step(i: int) -> float:
        ids = torch.randint(0, VOCAB, (B, T + 1), device=device, generator=gen)  # (B, T+1)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = forward(ids[:, :-1], ids[:, 1:])
        (loss / accum).backward()
        if (i + 1) % accum == 0:
            float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))  # the loop syncs here too
            opt.step()
            opt.zero_grad(set_to_none=True)
        return float(loss.detach()) if i < 1 else math.nan

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    first_loss = micro_step(0)
    sync()
    first_s = time.perf_counter() - t0
    for i in range(1, warmup):
        micro_step(i)
    sync()
    t0 = time.perf_counter()
    steps = 0
    while steps < max_steps and (steps == 0 or time.perf_counter() - t0 < measure_s):
        micro_step(warmup + steps)
        steps += 1
        if steps % 8 == 0:
            sync()  # the clock is read only after the GPU caught up
    sync()
    elapsed = time.perf_counter() - t0
    tokens_per_s = steps * B * T / elapsed
    fpt = flops.flops_per_token(cfg.model)
    name = torch.cuda.get_device_name(device) if cuda else None
    peak = flops.peak_tflops(name)
    step_s = elapsed / steps
    return {
        "mode": "eager" if compile_mode == "none" else f"compile {compile_mode}",
        "attention": "flash-attn" if use_flash else "SDPA",
        "steps": steps, "tokens_per_s": tokens_per_s, "micro_step_ms": 1e3 * step_s,
        "mfu_honest": flops.mfu(tokens_per_s, fpt.honest, peak),
        "mfu_lab_6n": flops.mfu(tokens_per_s, fpt.lab_6n, peak),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else math.nan,
        "reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30 if cuda else math.nan,
        "first_step_s": first_s, "compile_s": max(first_s - step_s, 0.0) if compile_mode != "none" else math.nan,
        "first_loss": first_loss, "optimizer_step_s": step_s * accum,
        "tokens_per_optimizer_step": B * T * accum, "micro_batch": B, "seq_len": T, "grad_accum": accum,
    }


def bf16_vs_fp32(cfg: Any, device: Any, steps: int, batch: int) -> dict[str, Any]:
    """The same init and fixed batch trained ``steps`` optimizer steps in true fp32 and in bf16 autocast."""
    import torch

    from x1_pretrain.model.transformer import flash_available

    cuda = device.type == "cuda"
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device=device).manual_seed(2)
    ids = torch.randint(0, VOCAB, (batch, cfg.model.seq_len + 1), device=device, generator=gen)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
    curves: dict[str, list[float]] = {}
    try:
        for precision in ("fp32", "bf16"):
            model, opt = build(cfg, device, use_flash=precision == "bf16" and cuda and flash_available())
            losses = []
            for _ in range(steps):
                if precision == "bf16":
                    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                        loss = model(ids[:, :-1], ids[:, 1:])
                else:
                    loss = model(ids[:, :-1], ids[:, 1:])
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
            curves[precision] = losses
            del model, opt
            if cuda:
                torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    f, b = curves["fp32"], curves["bf16"]
    diffs = [abs(x - y) for x, y in zip(f, b, strict=True)]
    rel = max(d / abs(x) for d, x in zip(diffs, f, strict=True))
    ok = all(map(math.isfinite, f + b)) and rel <= 0.02 and diffs[-1] <= 0.1
    return {"steps": steps, "batch": batch, "seq_len": cfg.model.seq_len, "fp32_first": f[0], "fp32_last": f[-1],
            "bf16_first": b[0], "bf16_last": b[-1], "max_abs_diff": max(diffs), "max_rel_diff": rel,
            "final_abs_diff": diffs[-1], "ok": ok}


def report(device: Any) -> dict[str, Any]:
    import torch

    from x1_pretrain import __version__
    from x1_pretrain.model.transformer import flash_available

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda (torch build)": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton") or _version("pytorch-triton"),
        "flash-attn": (_version("flash-attn") or _version("flash_attn") or "not installed")
        + ("" if flash_available() else " (not importable)" if _version("flash-attn") else ""),
        "x1_pretrain": __version__,
    }
    if device.type != "cuda":
        info["GPU"] = "none: no CUDA GPU detected (torch.cuda.is_available() is False)"
        info["attention kernel"] = "SDPA on the CPU (flash-attn needs CUDA)"
        return info
    props = torch.cuda.get_device_properties(device)
    info["GPU"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}, " \
                  f"{props.multi_processor_count} SMs"
    info["driver"] = _nvidia_smi("driver_version")
    info["bf16 supported"] = torch.cuda.is_bf16_supported()
    backends = sdpa_backends(device)
    info["SDPA backends accepting the lab's GQA shapes (bf16)"] = ", ".join(backends) or "none"
    info["attention kernel"] = "flash-attn 2 (flash_attn_func), as x1 uses under bf16 on CUDA" if flash_available() \
        else f"PyTorch SDPA ({backends[0] if backends else '?'} backend first); flash-attn not importable"
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


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


# --- orchestration -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Result:
    phase: str
    mode: str
    status: str                      # ok | timed out | failed: ...
    data: dict[str, Any]
    wall_s: float


def run_child(phase: str, mode: str, args: argparse.Namespace, timeout_s: float, log: Path) -> Result:
    """One phase in a fresh process (own session, so a timeout kills its compile workers too)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result_file = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", phase, "--compile-mode", mode,
           "--config", str(args.config), "--max-steps", str(args.max_steps), "--measure-s", str(args.measure_s),
           "--result-file", str(result_file)]
    t0 = time.monotonic()
    with open(log, "a") as logf:
        logf.write(f"\n===== {phase} {mode} (timeout {timeout_s:.0f} s) =====\n")
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    wall = time.monotonic() - t0
    try:
        data = json.loads(result_file.read_text()) if code == 0 else {}
    except (OSError, json.JSONDecodeError):
        data = {}
    result_file.unlink(missing_ok=True)
    if code is None:
        status = f"timed out after {timeout_s:.0f} s"
    elif code != 0 or not data:
        status = f"failed (exit {code}): {_last_error(log)}"
    else:
        status = "ok"
    return Result(phase, mode, status, data, wall)


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[:160]
    return lines[-1][:160] if lines else "no output"


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return format(x, spec)


def markdown(info: dict[str, Any], results: list[Result], cfg: Any, smoke: bool, total_s: float) -> str:
    from x1_pretrain.model import flops

    fpt = flops.flops_per_token(cfg.model)
    lines = [f"# x1 GPU check ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {total_s:.0f} s)", ""]
    if smoke:
        lines += ["**No CUDA GPU detected**: versions and a 2-step CPU smoke run of the same code paths on a tiny "
                  "config only. Nothing below is a measurement.", ""]
    lines += ["| item | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in info.items()] + [""]
    m = cfg.model
    lines += [f"## Throughput: {m.n_layer} layers, d_model {m.d_model}, {m.n_head}/{m.n_kv_head} heads, seq "
              f"{m.seq_len}, micro-batch {cfg.train.micro_batch_size}, grad accum {cfg.train.grad_accum_steps}, bf16 "
              f"autocast, random ids",
              f"FLOPs/token: honest {fpt.honest:.3e}, lab 6N {fpt.lab_6n:.3e} (see ERRATA 1).", "",
              "| mode | attention | micro-steps timed | tokens/s | MFU honest | MFU lab 6N | ms/micro-step | "
              "peak mem GiB | first step s | compile ≈ s | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    best: dict[str, Any] | None = None
    for r in results:
        if r.phase != "throughput":
            continue
        d = r.data
        lines.append(f"| {d.get('mode', r.mode)} | {d.get('attention', '—')} | {d.get('steps', '—')} | "
                     f"{_fmt(d.get('tokens_per_s'), ',.0f')} | {_fmt(d.get('mfu_honest'), '.3f')} | "
                     f"{_fmt(d.get('mfu_lab_6n'), '.3f')} | {_fmt(d.get('micro_step_ms'), '.1f')} | "
                     f"{_fmt(d.get('peak_mem_gib'), '.1f')} | {_fmt(d.get('first_step_s'), '.1f')} | "
                     f"{_fmt(d.get('compile_s'), '.0f')} | {r.status} |")
        if r.status == "ok" and (best is None or d["tokens_per_s"] > best["tokens_per_s"]):
            best = d
    if best is not None and not smoke:
        step_s = best["tokens_per_optimizer_step"] / best["tokens_per_s"]
        steps_24h = int(24 * 3600 / step_s)
        lines += ["", f"Best: {best['mode']}, {best['tokens_per_s']:,.0f} tokens/s = {step_s:.2f} s per optimizer step "
                      f"of {best['tokens_per_optimizer_step']:,} tokens on this GPU: ~{steps_24h:,} steps "
                      f"(~{steps_24h * best['tokens_per_optimizer_step'] / 1e9:.1f}B tokens) in 24 h. "
                      f"For the launch gate on this GPU: `--expected-step-s {step_s:.2f}`."]
    for r in results:
        if r.phase != "bf16-vs-fp32":
            continue
        d = r.data
        lines += ["", f"## bf16 vs fp32: {d.get('steps', '?')} optimizer steps on one fixed batch of "
                      f"{d.get('batch', '?')} x {d.get('seq_len', '?')} random ids, same init",
                  "", "| fp32 loss first → last | bf16 loss first → last | max abs Δ | max rel Δ | final abs Δ | "
                      "verdict |", "|---|---|---|---|---|---|"]
        verdict = ("tracks (rel ≤ 2%, final ≤ 0.1)" if d.get("ok") else "DOES NOT TRACK") if r.status == "ok" \
            else r.status
        lines.append(f"| {_fmt(d.get('fp32_first'), '.3f')} → {_fmt(d.get('fp32_last'), '.3f')} | "
                     f"{_fmt(d.get('bf16_first'), '.3f')} → {_fmt(d.get('bf16_last'), '.3f')} | "
                     f"{_fmt(d.get('max_abs_diff'), '.4f')} | {_fmt(d.get('max_rel_diff'), '.4f')} | "
                     f"{_fmt(d.get('final_abs_diff'), '.4f')} | {verdict} |")
    return "\n".join(lines) + "\n"


def _write(out: Path | None, text: str) -> None:
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, out)


def orchestrate(args: argparse.Namespace) -> int:
    import torch

    started = time.monotonic()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    info = report(device)
    if not cuda:
        print("[gpu_check] no GPU detected: reporting versions and running a CPU smoke test only", flush=True)
    for k, v in info.items():
        print(f"[gpu_check]   {k}: {v}", flush=True)
    cfg = load_config(args.config, tiny=not cuda)
    results: list[Result] = []
    if not cuda:  # the smoke: same functions, in this process, a tiny config, 2 steps each
        t0 = time.monotonic()
        tracked = bf16_vs_fp32(cfg, device, steps=2, batch=2)
        results.append(Result("bf16-vs-fp32", "none", "ok (smoke)", tracked, time.monotonic() - t0))
        t0 = time.monotonic()
        tp = throughput(cfg, device, "none", max_steps=2, measure_s=5.0, warmup=1)
        results.append(Result("throughput", "none", "ok (smoke)", tp, time.monotonic() - t0))
        print("[gpu_check] CPU smoke run: 2 steps of each phase ran", flush=True)
    else:
        torch.cuda.empty_cache()
        log = args.out.with_suffix(".log") if args.out else Path(tempfile.gettempdir()) / "x1-gpu-check.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        for phase, mode, timeout_s in GPU_PHASES:
            left = args.deadline_s - (time.monotonic() - started) - 5.0
            if left < 20:
                results.append(Result(phase, mode, "skipped: --deadline-s reached", {}, 0.0))
                continue
            print(f"[gpu_check] {phase} {mode} (at most {min(timeout_s, left):.0f} s) ...", flush=True)
            r = run_child(phase, mode, args, min(timeout_s, left), log)
            results.append(r)
            print(f"[gpu_check]   {r.status} in {r.wall_s:.0f} s"
                  + (f": {r.data['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in r.data else ""), flush=True)
            _write(args.out, markdown(info, results, cfg, False, time.monotonic() - started))
        print(f"[gpu_check] child logs: {log}", flush=True)
    table = markdown(info, results, cfg, not cuda, time.monotonic() - started)
    _write(args.out, table)
    print(table, flush=True)
    if args.out:
        print(f"[gpu_check] table written to {args.out}", flush=True)
    return 0


def child(args: argparse.Namespace) -> int:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_config(args.config, tiny=device.type != "cuda")
    if args.phase == "throughput":
        data = throughput(cfg, device, args.compile_mode, args.max_steps, args.measure_s)
    else:
        data = bf16_vs_fp32(cfg, device, steps=50, batch=8)
    args.result_file.write_text(json.dumps(data))
    print(json.dumps(data), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="markdown table to write (also printed)")
    p.add_argument("--config", type=Path, default=LAB_CONFIG, help="model/optimizer config (default: the lab's)")
    p.add_argument("--deadline-s", type=float, default=420.0, help="wall-clock budget for all phases")
    p.add_argument("--max-steps", type=int, default=256, help="timed micro-steps per throughput phase at most")
    p.add_argument("--measure-s", type=float, default=25.0, help="timed seconds per throughput phase at most")
    p.add_argument("--phase", choices=["all", "throughput", "bf16-vs-fp32"], default="all", help=argparse.SUPPRESS)
    p.add_argument("--compile-mode", default="none", help=argparse.SUPPRESS)
    p.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.config.is_file():
        print(f"error: --config {args.config}: no such file (run from the x1 checkout, or pass --config)",
              file=sys.stderr)
        return 2
    return orchestrate(args) if args.phase == "all" else child(args)


if __name__ == "__main__":
    raise SystemExit(main())
