"""Compiled against eager: the same losses over a few optimizer steps, and what the compilation costs.

    .venv/bin/python bench/compile_equality.py [--steps 5] [--mode default] [--scope model|blocks]

x1's tiny config (fp32, CPU) with gradient accumulation (2 micro-steps), AdamW, one init and one stream of
batches for both. Prints the losses side by side, the largest difference (target <= 1e-5) and the first
compiled step's time. Inductor writes into a fresh cache directory, so the compile time is a cold one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--mode", default="default")
    p.add_argument("--scope", choices=["model", "blocks"], default="model")
    args = p.parse_args(argv)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="x1-bench-inductor-")
    from pathlib import Path

    import torch

    from x1_pretrain.core import config as C
    from x1_pretrain.model.transformer import Transformer
    from x1_pretrain.trainer.device import compile_model
    from x1_pretrain.trainer.optim import build_optimizer

    repo = Path(__file__).resolve().parents[1]
    cfg = C.load(repo / "configs" / "x1-tiny-cpu.yaml", sets=["model.seq_len=32"])
    torch.manual_seed(0)
    eager = Transformer(cfg.model)
    other = Transformer(cfg.model)
    other.load_state_dict(eager.state_dict())
    opts = [build_optimizer(m, cfg, torch.device("cpu")) for m in (eager, other)]
    compiled = compile_model(other, other, args.mode, args.scope, print)
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    print(
        f"tiny config, {args.steps} optimizer steps of 2 micro-batches of 8 x 32, compile mode {args.mode}, "
        f"scope {args.scope}"
    )
    for step in range(args.steps):
        losses = []
        t0 = time.perf_counter()
        ids = [torch.randint(0, cfg.model.vocab_size, (8, 33), generator=gen) for _ in range(2)]
        for forward, opt in ((eager, opts[0]), (compiled, opts[1])):  # the same batches for both
            total = 0.0
            for x in ids:
                loss = forward(x[:, :-1], x[:, 1:])
                (loss / 2).backward()
                total += float(loss.detach()) / 2
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total)
        dt = time.perf_counter() - t0
        worst = max(worst, abs(losses[0] - losses[1]))
        print(
            f"  step {step + 1}: eager {losses[0]:.7f}  compiled {losses[1]:.7f}  |diff| "
            f"{abs(losses[0] - losses[1]):.2e}  ({dt:.1f} s for both)"
        )
    print(f"max |loss diff| over {args.steps} steps: {worst:.2e}  (target <= 1e-5); fallback: {compiled.failed}")
    return 0 if worst <= 1e-5 and compiled.failed is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
