"""Peak memory of one forward + backward at a large-vocabulary micro-batch: x1 against transformers' Llama.

    .venv/bin/python bench/peak_memory.py [--batch 4] [--seq 512] [--repeats 2]

Same dimensions (the lab's vocabulary, 50,257 tokens), same batch, fp32 on the CPU. Each measurement runs in
a fresh process: the peak resident set (Linux VmHWM, reset just before the step through /proc/self/clear_refs)
minus the resident set before it, so the model, the optimizer and the inputs are not counted, only what the
step itself allocates. Rows: transformers' LlamaForCausalLM with ``labels=`` (its own loss, what HF users run),
x1 as configured (one-pass loss, padded vocabulary), and x1 with the one-pass loss off. Prints the ratios
x1/HF (target <= 0.6).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = ("hf", "x1", "x1-plain-loss")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(variant: str, batch: int, seq: int) -> dict[str, float]:
    """In this (fresh) process: build, then one warm-up step, then the measured forward + backward."""
    import dataclasses

    import torch

    from x1_pretrain.core.config import ModelConfig
    from x1_pretrain.model.transformer import Kernels, Transformer, hf_config

    torch.set_num_threads(1)
    m = ModelConfig(n_layer=4, d_model=256, n_head=4, n_kv_head=2, d_ff=704, seq_len=seq, vocab_size=50257)
    torch.manual_seed(0)
    x = torch.randint(0, m.vocab_size, (batch, seq))
    y = torch.randint(0, m.vocab_size, (batch, seq))
    if variant == "hf":
        import transformers

        cfg = {k: v for k, v in hf_config(m).items() if k != "architectures"}
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))

        def step() -> None:
            model(input_ids=x, labels=y).loss.backward()
    else:
        model = Transformer(dataclasses.replace(m))
        model.set_kernels(Kernels(fused_loss=variant == "x1"))

        def step() -> None:
            model(x, y).backward()

    step()  # warm-up: lazily made buffers, .grad tensors
    model.zero_grad(set_to_none=False)  # keep the grads allocated, as in training
    before = _rss_mib()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    step()
    return {"before_mib": before, "peak_mib": _peak_mib(), "step_mib": _peak_mib() - before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2, help="fresh processes per variant (the median is kept)")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.batch, args.seq)))
        return 0
    tokens = args.batch * args.seq
    print(
        f"forward+backward, 4 layers x 256, vocab 50,257, micro-batch {args.batch} x {args.seq} = {tokens:,} "
        f"tokens, fp32, CPU; logits alone are {tokens * 50257 * 4 / 2**20:,.0f} MiB"
    )
    results: dict[str, float] = {}
    for variant in VARIANTS:
        runs = []
        for _ in range(args.repeats):
            out = subprocess.run(
                [sys.executable, __file__, "--child", variant, "--batch", str(args.batch), "--seq", str(args.seq)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1])["step_mib"])
        results[variant] = statistics.median(runs)
        print(f"  {variant:14s} step peak {results[variant]:8,.0f} MiB  (runs: {', '.join(f'{r:,.0f}' for r in runs)})")
    print(f"ratio x1 / HF: {results['x1'] / results['hf']:.2f}  (target <= 0.6)")
    print(f"ratio x1 with the plain loss / HF: {results['x1-plain-loss'] / results['hf']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
