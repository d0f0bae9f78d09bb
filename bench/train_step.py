"""Training-step speed of x1's Transformer against transformers' LlamaForCausalLM, in one run.

    .venv/bin/python bench/train_step.py [--preset small|lab-width] [--steps 10] [--compile]

Both models get the same dimensions, batch and seed; each step is forward + backward + AdamW step, fp32,
eager, on the CPU. Prints median step times and the ratio x1/HF (target <= 1.0). Also measures the
data loader alone (tokens/s on one core; target >= 20M) and the MLflow logging overhead as a share of
step time (batched metrics through a real sqlite store).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from x1_pretrain.core.config import ModelConfig
from x1_pretrain.data.tokens import Sampler, gather
from x1_pretrain.model.transformer import Transformer, hf_config

PRESETS = {
    # small enough for a 2-core CPU, same shape ratios as the lab model
    "small": ModelConfig(n_layer=4, d_model=256, n_head=4, n_kv_head=2, d_ff=704, seq_len=256, vocab_size=50257),
    # the lab's width and heads with fewer layers and a shorter context
    "lab-width": ModelConfig(n_layer=2, d_model=768, n_head=12, n_kv_head=4, d_ff=2048, seq_len=256, vocab_size=50257),
}


def time_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, hf: bool) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        if hf:
            loss = model(input_ids=x, labels=None).logits
            loss = torch.nn.functional.cross_entropy(loss.float().view(-1, loss.shape[-1]), y.reshape(-1))
        else:
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    return times


def bench_models(m: ModelConfig, batch: int, steps: int, compile_too: bool) -> None:
    import transformers

    torch.manual_seed(0)
    x = torch.randint(0, m.vocab_size, (batch, m.seq_len))
    y = torch.randint(0, m.vocab_size, (batch, m.seq_len))
    ours = Transformer(m)
    cfg = {k: v for k, v in hf_config(m).items() if k != "architectures"}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    hf.load_state_dict({k: v.clone() for k, v in ours.state_dict().items()}, strict=False)
    hf.train()
    # interleave to share the machine's noise fairly
    t_ours, t_hf = [], []
    for _ in range(2):
        t_ours += time_steps(ours, x, y, steps // 2, hf=False)
        t_hf += time_steps(hf, x, y, steps // 2, hf=True)
    mo, mh = statistics.median(t_ours), statistics.median(t_hf)
    print(
        f"model: {m.n_layer} layers, d_model {m.d_model}, heads {m.n_head}/{m.n_kv_head}, d_ff {m.d_ff}, "
        f"seq {m.seq_len}, batch {batch}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"threads {torch.get_num_threads()}"
    )
    print(f"x1 Transformer        median step {mo * 1000:8.1f} ms")
    print(f"HF LlamaForCausalLM   median step {mh * 1000:8.1f} ms   (attn: {hf.config._attn_implementation})")
    print(f"ratio x1/HF = {mo / mh:.3f} (target <= 1.0)")
    if compile_too:
        compiled = torch.compile(Transformer(m))
        t0 = time.perf_counter()
        time_steps(compiled, x, y, 1, hf=False)
        print(f"x1 + torch.compile: first steps (compile) {time.perf_counter() - t0:.1f} s")
        tc = statistics.median(time_steps(compiled, x, y, steps, hf=False))
        print(f"x1 + torch.compile    median step {tc * 1000:8.1f} ms   ratio compiled/eager {tc / mo:.3f}")


def bench_loader(seq_len: int = 1024, micro: int = 32) -> None:
    tokens = (np.arange(50_000_000, dtype=np.int64) % 50257).astype(np.uint16)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.bin"
        tokens.tofile(path)
        mm = np.memmap(path, dtype=np.uint16, mode="r")
        s = Sampler(mm.size, seq_len, 42, micro, 16)
        n = 0
        t0 = time.perf_counter()
        for step in range(20):
            for c in range(16):
                x, _ = gather(mm, s.starts(step, c), seq_len)
                n += x.numel()
        dt = time.perf_counter() - t0
    print(
        f"data loader (memmap -> int64 tensors, seq {seq_len}, micro-batch {micro}): {n / dt / 1e6:.1f} M tokens/s "
        f"on one thread (target >= 20)"
    )


def bench_logging(steps: int = 200) -> None:
    from x1_pretrain.trainer.tracking import MlflowTracker

    keys = [
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/param_norm",
        "train/tokens_per_s",
        "train/mfu",
        "train/step_time_s",
        "train/tokens_seen",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        tracker = MlflowTracker(f"sqlite:///{tmp}/m.db", Path(tmp).as_uri(), "bench", flush_every_s=5.0)
        t0 = time.perf_counter()
        for step in range(steps):
            tracker.log_metrics(step, {k: float(step) for k in keys})
        enqueue = (time.perf_counter() - t0) / steps
        t0 = time.perf_counter()
        tracker.flush()
        flush = time.perf_counter() - t0
        tracker.close()
    per_log = enqueue + flush / steps
    for step_s, label in ((0.5, "lab A100 step ~0.5-2 s, logging every 10 steps"),):
        share = per_log / (10 * step_s)
        print(
            f"logging: {enqueue * 1e6:.0f} us to enqueue {len(keys)} metrics on the training thread, "
            f"{flush / steps * 1e3:.2f} ms per log call to deliver in the background; "
            f"share of training time ({label}): {share * 100:.3f}% (target < 1%)"
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    bench_models(PRESETS[args.preset], args.batch, args.steps, args.compile)
    bench_loader()
    bench_logging()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
