"""AdamW against Muon, and the recipe choices that stay HF-exportable, in one run on the same data and batches.

    .venv/bin/python bench/optimizer_ab.py [--steps 400] [--quick]

x1's own Transformer (4 layers, d_model 128, GQA 4/2 heads, SwiGLU 352, seq 128) trained from one init on one
stream of batches (16 x 128 tokens a step, from one seed) with x1's optimizers and x1's schedule (warm-up 10 %
then cosine to a tenth): every arm sees the same sequences in the same order. The text is real web text (the
developers' FineWeb-Edu, DCLM and Dolma samples where present, else CPython's ``pydoc_data.topics``), tokenized
with GPT-2's BPE; so that a 2-core CPU runs it in minutes, the ids are renumbered by frequency and the rarest are
pooled into one id (8,192 in all: the LM head's cost falls 6x, the same for every arm).

Prints, per arm: the val loss (32 fixed windows) every 10 % of the run, the final one, the seconds a step (Muon's
Newton–Schulz included) and, for Muon, how many tokens it took to reach AdamW's best final loss (interpolated
between evals) and the ratio to AdamW's tokens (the issue's goal: >= 1.5x fewer). Then the recipe arms on top of
the best Muon arm: an untied LM head, zero-initialised output projections (attention o_proj, MLP down_proj).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections import Counter
from pathlib import Path

VOCAB, SEQ, BATCH, VAL_WINDOWS = 8192, 128, 16, 32


def tokens(docs: list[str]):
    """(train ids, val ids) as int64 tensors over the renumbered vocabulary; the last 5 % of documents are val."""
    import torch

    from x1_pretrain.data.tokenizer import load_gpt2

    tok = load_gpt2(allow_download=False)
    ids = [[*tok.encode(d), tok.eot_id] for d in docs]
    cut = max(1, len(ids) * 95 // 100)
    train = [i for d in ids[:cut] for i in d]
    val = [i for d in ids[cut:] for i in d]
    keep = [t for t, _ in Counter(train).most_common(VOCAB - 1)]
    rank = {t: r for r, t in enumerate(keep)}
    remap = lambda seq: torch.tensor([rank.get(t, VOCAB - 1) for t in seq], dtype=torch.long)  # noqa: E731
    return remap(train), remap(val)


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    sets: tuple[str, ...]
    zero_init_out: bool = False


def train(arm: Arm, base: list[str], train_ids, val_ids, steps: int, evals: list[int]) -> dict:
    import torch

    from x1_pretrain.core import config as C
    from x1_pretrain.model.transformer import Transformer
    from x1_pretrain.trainer.optim import build_optimizer, set_lr
    from x1_pretrain.trainer.schedule import lr_at

    repo = Path(__file__).resolve().parents[1]
    cfg = C.load(repo / "configs" / "x1-tiny-cpu.yaml", sets=[*base, *arm.sets])
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    if arm.zero_init_out:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1234)  # the same batches for every arm
    n = len(train_ids) - SEQ - 1
    vstarts = torch.linspace(0, len(val_ids) - SEQ - 2, VAL_WINDOWS).long()
    vx = torch.stack([val_ids[s : s + SEQ] for s in vstarts])
    vy = torch.stack([val_ids[s + 1 : s + SEQ + 1] for s in vstarts])

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            loss = float(model(vx, vy))
        model.train()
        return loss

    curve, t_steps = {}, 0.0
    for step in range(steps):
        starts = torch.randint(0, n, (BATCH,), generator=gen)
        x = torch.stack([train_ids[s : s + SEQ] for s in starts])
        y = torch.stack([train_ids[s + 1 : s + SEQ + 1] for s in starts])
        t0 = time.perf_counter()
        set_lr(opt, lr_at(step, cfg.optim, steps), cfg.optim)
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_steps += time.perf_counter() - t0
        if step + 1 in evals:
            curve[step + 1] = val_loss()
    return {"curve": curve, "s_per_step": t_steps / steps, "final": curve[steps]}


def steps_to_reach(curve: dict[int, float], target: float) -> float | None:
    """The first step at which the val curve (linear between evals) reaches ``target``; None if it never does."""
    points = sorted(curve.items())
    prev = (0, math.inf)
    for s, loss in points:
        if loss <= target:
            if not math.isfinite(prev[1]):
                return float(s)
            return prev[0] + (s - prev[0]) * (prev[1] - target) / (prev[1] - loss)
        prev = (s, loss)
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--quick", action="store_true", help="30 steps, two arms: a smoke run of the bench itself")
    args = p.parse_args(argv)
    import torch

    steps = 30 if args.quick else args.steps
    from tokenize_throughput import corpus_documents  # bench/ is on the path of a script run from it

    docs, source = corpus_documents()
    train_ids, val_ids = tokens(docs)
    evals = sorted({max(1, steps * k // 10) for k in range(1, 11)})
    base = [
        "model.n_layer=4",
        "model.d_model=128",
        "model.n_head=4",
        "model.n_kv_head=2",
        "model.d_ff=352",
        f"model.seq_len={SEQ}",
        f"model.vocab_size={VOCAB}",
        "model.vocab_pad_multiple=1",
        f"optim.warmup_steps={max(1, steps // 10)}",
        "optim.schedule=cosine",
    ]
    adamw = [
        Arm(f"AdamW lr {lr:g}", ("optim.name=adamw", f"optim.lr={lr}", f"optim.min_lr={lr / 10}"))
        for lr in (1e-3, 3e-3)
    ]
    print(
        f"data: {source}: {len(train_ids):,} train / {len(val_ids):,} val tokens; {steps} steps of {BATCH} x {SEQ} "
        f"tokens; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    results: dict[str, dict] = {}

    def run(arm: Arm) -> dict:
        r = train(arm, base, train_ids, val_ids, steps, evals)
        results[arm.name] = r
        print(f"  {arm.name:<58} val {r['final']:.4f}  {r['s_per_step'] * 1000:7.1f} ms/step", flush=True)
        return r

    for arm in adamw[: 1 if args.quick else 2]:
        run(arm)
    best_adamw = min((k for k in results if k.startswith("AdamW")), key=lambda k: results[k]["final"])
    adam_lr = dict(s.split("=") for s in next(a for a in adamw if a.name == best_adamw).sets)["optim.lr"]
    rest = (f"optim.lr={adam_lr}", f"optim.min_lr={float(adam_lr) / 10}")  # AdamW's part of a Muon run
    muon = [
        Arm("Muon lr 0.02 (original rule)", ("optim.name=muon", "optim.muon_lr=0.02", *rest)),
        Arm(
            "Muon lr 3e-3 (match_rms_adamw)",
            ("optim.name=muon", "optim.muon_lr=0.003", "optim.muon_adjust_lr=match_rms_adamw", *rest),
        ),
    ]
    for arm in muon[: 1 if args.quick else 2]:
        run(arm)
    best_muon = min((a for a in muon if a.name in results), key=lambda a: results[a.name]["final"])
    if not args.quick:
        run(Arm(f"{best_muon.name} + untied head", (*best_muon.sets, "model.tie_embeddings=false")))
        run(Arm(f"{best_muon.name} + zero-init out projections", best_muon.sets, zero_init_out=True))

    target = results[best_adamw]["final"]
    print(f"\nval loss every {steps // 10} steps ({BATCH * SEQ:,} tokens a step):")
    print(f"  {'arm':<58} " + " ".join(f"{s:>6}" for s in evals))
    for name, r in results.items():
        print(f"  {name:<58} " + " ".join(f"{r['curve'][s]:6.3f}" for s in evals))
    print(f"\nAdamW's best final val loss: {target:.4f} ({best_adamw}, {steps} steps)")
    base_s = results[best_adamw]["s_per_step"]
    for name, r in results.items():
        if name.startswith("AdamW"):
            continue
        reach = steps_to_reach(r["curve"], target)
        ratio = f"{steps / reach:.2f}x fewer tokens" if reach else "never reached"
        print(
            f"  {name:<58} reaches it at step {reach:.0f} ({ratio}); final {r['final']:.4f} "
            f"({target - r['final']:+.3f} nats); {r['s_per_step'] / base_s:.2f}x AdamW's time a step"
            if reach
            else f"  {name:<58} {ratio}; final {r['final']:.4f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
