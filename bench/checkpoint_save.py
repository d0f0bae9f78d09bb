"""Checkpoint save time at the lab's scale (the 88.9M-parameter model + AdamW state, ~1.07 GB).

    .venv/bin/python bench/checkpoint_save.py [--dir /path/on/the/target/disk]

Reference, in the same run and on the same disk: writing the same number of bytes with one sequential
write + fsync. Prints the training pause (the CPU snapshot, the only part on the training thread when
async_save is on), the full save time, MB/s, and the ratio save / raw write.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core.config import Config
from x1_pretrain.model.transformer import Transformer, state_dict_for_saving


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = Config()
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # give AdamW its state without a (slow, on CPU) forward pass
        p.grad = torch.zeros_like(p)
    opt.step()
    base = Path(tempfile.mkdtemp(prefix="x1-bench-ckpt-", dir=args.dir))
    try:
        rows = []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            snap = ck.StepSnapshot(
                r + 1, ck.to_cpu(state_dict_for_saving(model)), ck._to_cpu(opt.state_dict()), {"step": r + 1}
            )
            pause = time.perf_counter() - t0
            path, size = ck.write_step_dir(base, snap)
            total = time.perf_counter() - t0
            blob = os.urandom(1 << 20) * (size >> 20)
            t1 = time.perf_counter()
            with open(base / "raw.bin", "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            raw = time.perf_counter() - t1
            (base / "raw.bin").unlink()
            shutil.rmtree(path)
            rows.append((pause, total, size, raw))
        print(
            f"checkpoint of the lab model: {rows[0][2] / 1e9:.3f} GB (model.safetensors + optimizer.safetensors) on "
            f"{base.parent}"
        )
        print("| run | training pause (snapshot) s | full save s | MB/s | raw write+fsync s | ratio save/raw |")
        print("|---|---|---|---|---|---|")
        for i, (pause, total, size, raw) in enumerate(rows, 1):
            print(f"| {i} | {pause:.2f} | {total:.2f} | {size / 1e6 / total:.0f} | {raw:.2f} | {total / raw:.2f} |")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
