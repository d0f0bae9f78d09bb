"""Time and peak memory of the LM head + cross-entropy, forward and backward, on the CPU: x1's one-pass loss
eager and compiled, against the plain route (``F.cross_entropy`` on the full logits) measured in the same run.

    .venv/bin/python bench/loss_chunk.py [--tokens 2048] [--dim 256] [--chunk 1024] [--repeats 3] [--bf16]

The lab's vocabulary (50,257, padded to 50,304), ``--tokens`` hidden states of width ``--dim``. Each variant
runs in a fresh process (one warm-up call, compilation included, then ``--repeats`` timed calls; the median
is kept) and reports its peak resident set above what it held before the timed calls. Prints each variant's
time and memory against the plain route's. To see a change before and after, run it with ``PYTHONPATH``
pointing at the other commit's ``src``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("plain", "x1-eager", "x1-compiled")
VOCAB, ROWS = 50257, 50304


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(variant: str, args: argparse.Namespace) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    from x1_pretrain.model.loss import linear_cross_entropy

    torch.manual_seed(0)
    h = torch.randn(args.tokens, args.dim, requires_grad=True)
    w = (torch.randn(ROWS, args.dim) * 0.05).requires_grad_(True)
    y = torch.randint(0, VOCAB, (args.tokens,))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()

    def plain() -> torch.Tensor:
        return F.cross_entropy((h @ w.t())[:, :VOCAB].float(), y)

    def ours() -> torch.Tensor:
        return linear_cross_entropy(h, w, y, VOCAB, chunk_tokens=args.chunk)

    fn = plain if variant == "plain" else ours
    if variant == "x1-compiled":
        fn = torch.compile(ours)

    def step() -> None:
        with autocast:
            loss = fn()
        loss.backward()
        h.grad = w.grad = None

    t0 = time.perf_counter()
    step()  # warm-up (and compilation)
    first = time.perf_counter() - t0
    before = _rss_mib()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the current resident set
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"s": statistics.median(times), "first_s": first, "peak_mib": _peak_mib() - before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--chunk", type=int, default=1024, help="train.loss_chunk_tokens")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bf16", action="store_true", help="under bf16 autocast, as the GPU runs")
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args)))
        return 0
    import tempfile

    print(
        f"LM head + cross-entropy, {args.tokens:,} tokens x {args.dim}, vocabulary {VOCAB:,} ({ROWS:,} rows), "
        f"chunk {args.chunk:,}, {'bf16 autocast' if args.bf16 else 'fp32'}, CPU, forward + backward"
    )
    results = {}
    with tempfile.TemporaryDirectory() as cache:  # a cold, private Inductor cache
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for variant in VARIANTS:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--tokens",
                str(args.tokens),
                "--dim",
                str(args.dim),
                "--chunk",
                str(args.chunk),
                "--repeats",
                str(args.repeats),
            ]
            out = subprocess.run(
                cmd + (["--bf16"] if args.bf16 else []), capture_output=True, text=True, check=True, env=env
            )
            results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["plain"]
    for variant, r in results.items():
        print(
            f"  {variant:12s} {r['s'] * 1000:8.0f} ms ({base['s'] / r['s']:.2f}x plain's speed)  "
            f"peak {r['peak_mib']:7,.0f} MiB ({r['peak_mib'] / base['peak_mib']:.2f} of plain's)  "
            f"first call {r['first_s']:.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
