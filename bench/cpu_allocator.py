"""The CPU allocator setting the trainer applies on a CPU (core.env.keep_freed_memory), measured.

    python bench/cpu_allocator.py [--steps 20]

Runs the same forward+backward of the tiny test model (seq 32, micro-batch 8, the GPT-2 vocabulary) in two
fresh processes, one with glibc's defaults and one with freed memory kept in the heap, and prints the step
times, the kernel (sys) time of each process and the ratio tuned/default.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, torch
from x1_pretrain.core.config import ModelConfig
from x1_pretrain.core.env import keep_freed_memory
from x1_pretrain.model.transformer import Transformer
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else False
torch.manual_seed(0)
m = Transformer(ModelConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=176, seq_len=32, vocab_size=50257))
x = torch.randint(0, 50257, (8, 32)); y = torch.randint(0, 50257, (8, 32))
for _ in range(3):
    m(x, y).backward()
steps = int(sys.argv[2]); t = time.perf_counter()
for _ in range(steps):
    m(x, y).backward()
dt = (time.perf_counter() - t) / steps
r = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"tuned": tuned, "step_ms": dt * 1e3, "sys_s": r.ru_stime, "user_s": r.ru_utime}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args(argv)
    out = {}
    for mode in ("default", "tuned", "default", "tuned"):  # interleaved against drift
        r = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(args.steps)], capture_output=True, text=True, check=True
        )
        res = json.loads(r.stdout.strip().splitlines()[-1])
        out.setdefault(mode, []).append(res)
    for mode, runs in out.items():
        best = min(runs, key=lambda r: r["step_ms"])
        print(f"{mode:8s} step {best['step_ms']:7.1f} ms   sys {best['sys_s']:5.2f} s   user {best['user_s']:5.2f} s")
    ratio = min(r["step_ms"] for r in out["tuned"]) / min(r["step_ms"] for r in out["default"])
    print(f"ratio tuned/default: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
