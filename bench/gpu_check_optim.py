"""gpu_check's optimizer-ab phase: AdamW (the config as it is) against Muon (configs/x1-50m-muon.yaml's
optimizer keys) on the same model, init, text and batches, for as many steps as the phase's time allows.

The text is the tokenize_data directory given with ``--ab-data`` (the lab's own FineWeb-Edu, the only data that
settles the lab's default), else real text present on every machine: CPython's ``pydoc_data.topics`` and the
standard library's Python source, tokenized with GPT-2's BPE (about 6M tokens; one document in 20 is val). Each
arm: one micro-batch per optimizer step, warm-up 10 % then cosine to a tenth over the same number of steps,
bf16 autocast as the config says, eager. It prints the val loss at five points, the seconds a step, and at which
step Muon reaches AdamW's final val loss. A few hundred steps is a short horizon: it shows whether Muon's lead
holds on this GPU at the lab's shapes, not what a 24 h run ends at.
"""

from __future__ import annotations

import dataclasses
import math
import sysconfig
import time
from pathlib import Path
from typing import Any

import gpu_check as G
from optimizer_ab import steps_to_reach

MUON_CONFIG = G.REPO / "configs" / "x1-50m-muon.yaml"
STEPS_MAX, STEPS_SMOKE, VAL_WINDOWS = 300, 4, 64
MUON_OVERHEAD = 1.35  # plan the steps so that the slower arm (Muon's Newton–Schulz) still finishes


def builtin_text() -> tuple[list[str], str]:
    """pydoc topics and the standard library's sources (sorted: the same order on every machine)."""
    from x1_pretrain.data.demo_corpus import demo_documents

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in stdlib.rglob("*.py") if not {"site-packages", "test", "tests"} & set(f.parts))
    docs = demo_documents() + [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return docs, f"pydoc_data.topics + {len(files)} stdlib sources of {stdlib}"


def token_streams(args: Any, cfg: Any, smoke: bool) -> tuple[Any, Any, str]:
    """(train ids, val ids, where they came from) as uint16/int64 numpy arrays."""
    import numpy as np

    if args.ab_data:
        from x1_pretrain.data.tokens import open_token_data

        data = open_token_data(args.ab_data, cfg.model.vocab_size, cfg.model.seq_len)
        return data.train, data.val, str(args.ab_data)
    from x1_pretrain.data.tokenizer import load_gpt2

    tok = load_gpt2(allow_download=False)
    docs, source = builtin_text()
    if smoke:
        docs = docs[:120]
    ids = tok.encoding.encode_ordinary_batch(docs)
    train = [t for i, d in enumerate(ids) if i % 20 for t in (*d, tok.eot_id)]
    val = [t for i, d in enumerate(ids) if i % 20 == 0 for t in (*d, tok.eot_id)]
    return np.asarray(train, np.int64), np.asarray(val, np.int64), source


def arm_configs(args: Any, smoke: bool) -> dict[str, Any]:
    """The two arms: the config as it is, and the same config with the Muon file's optimizer keys."""
    base = G.load_config(args.config, smoke, ["train.compile=false"])
    muon = G.load_config(MUON_CONFIG, smoke, ["train.compile=false"])
    model = dataclasses.replace(base.model, vocab_size=G.VOCAB)  # real GPT-2 ids, also in the smoke
    base = dataclasses.replace(base, model=model)
    return {"AdamW (config as is)": base, "Muon (x1-50m-muon.yaml)": dataclasses.replace(base, optim=muon.optim)}


class Stream:
    """Training windows from one seed (every arm the same sequence) and the fixed val windows."""

    def __init__(self, train: Any, val: Any, cfg: Any, device: Any) -> None:
        from x1_pretrain.data.tokens import val_starts

        self.train, self.val, self.cfg, self.device = train, val, cfg, device
        self.vstarts = val_starts(len(val), cfg.model.seq_len, VAL_WINDOWS if device.type == "cuda" else 4)
        self.restart()

    def restart(self) -> None:
        """Back to the first training batch (every arm sees the same sequence)."""
        import numpy as np

        self.rng = np.random.default_rng(1234)

    def batch(self) -> tuple[Any, Any]:
        from x1_pretrain.data.tokens import gather

        seq = self.cfg.model.seq_len
        starts = self.rng.integers(0, len(self.train) - seq - 1, self.cfg.train.micro_batch_size)
        x, y = gather(self.train, starts, seq)
        return x.to(self.device), y.to(self.device)

    def val_loss(self, model: Any) -> float:
        import torch

        from x1_pretrain.data.tokens import gather

        mb, total = self.cfg.train.micro_batch_size, 0.0
        model.eval()
        with torch.no_grad():
            for i in range(0, len(self.vstarts), mb):
                x, y = gather(self.val, self.vstarts[i : i + mb], self.cfg.model.seq_len)
                with G.autocast(self.cfg, self.device):
                    total += float(model(x.to(self.device), y.to(self.device))) * len(x)
        model.train()
        return total / len(self.vstarts)


def _timed_step(model: Any, opt: Any, cfg: Any, stream: Stream, step: int, steps: int, device: Any) -> float:
    """One optimizer step on the stream's next batch at the schedule's lr; returns its seconds."""
    import torch

    from x1_pretrain.trainer.optim import set_lr
    from x1_pretrain.trainer.schedule import lr_at

    x, y = stream.batch()
    G.sync(device)
    t0 = time.perf_counter()
    set_lr(opt, lr_at(step, cfg.optim, steps), cfg.optim)
    with G.autocast(cfg, device):
        loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
    opt.step()
    opt.zero_grad(set_to_none=True)
    G.sync(device)
    return time.perf_counter() - t0


def train_arm(cfg: Any, stream: Stream, steps: int, evals: list[int], device: Any) -> dict[str, Any]:
    import torch

    model, opt = G.build(cfg, device)
    curve: dict[int, float] = {}
    busy = 0.0
    for step in range(steps):
        seconds = _timed_step(model, opt, cfg, stream, step, steps, device)
        busy += seconds if step else 0.0  # the first step warms the kernels
        if step + 1 in evals:
            curve[step + 1] = stream.val_loss(model)
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"curve": curve, "final": curve[steps], "s_per_step": busy / max(1, steps - 1)}


def plan_steps(cfg: Any, stream: Stream, device: Any, seconds: float) -> tuple[int, float]:
    """Steps both arms can run in ``seconds`` (AdamW's step timed on a throwaway copy, Muon's overhead added)."""
    import torch

    model, opt = G.build(cfg, device, seed=7)
    times = [_timed_step(model, opt, cfg, stream, step, 4, device) for step in range(4)]
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    step_s = min(times[1:])
    fit = int(seconds / (2 * step_s * MUON_OVERHEAD))
    return max(10, min(STEPS_MAX, fit)), step_s


def phase_optimizer_ab(args: Any, device: Any, out: G.Partial) -> None:
    started = args.started_unix or time.time()  # the child's own start-up counts against its deadline
    smoke = device.type != "cuda"
    arms = arm_configs(args, smoke)
    base = next(iter(arms.values()))
    train, val, source = token_streams(args, base, smoke)
    stream = Stream(train, val, base, device)
    out.put("data", f"{source}: {len(train):,} train / {len(val):,} val tokens")
    if smoke:
        steps, step_s = STEPS_SMOKE, math.nan
    else:
        left = args.phase_budget_s - (time.time() - started) - 10.0  # evals and the model builds
        steps, step_s = plan_steps(base, stream, device, left)
    tokens_per_step = base.train.micro_batch_size * base.model.seq_len
    evals = sorted({max(1, steps * k // 5) for k in range(1, 6)})
    out.put("steps", steps)
    out.put("tokens_per_step", tokens_per_step)
    out.put("epochs", steps * tokens_per_step / len(train))
    out.put("planned_from_step_s", step_s)
    rows = []
    for name, cfg in arms.items():
        stream.restart()
        short = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, warmup_steps=max(1, steps // 10)))
        lr = cfg.optim.muon_lr if cfg.optim.name == "muon" else cfg.optim.lr
        rows.append({"arm": name, "lr": lr, **train_arm(short, stream, steps, evals, device)})
        out.put("rows", rows)
    adamw, muon = rows
    reach = steps_to_reach(muon["curve"], adamw["final"])
    out.put("muon_reaches_adamw_final_at", reach)
    out.put("fewer_tokens", steps / reach if reach else None)
    out.put("muon_time_ratio", muon["s_per_step"] / adamw["s_per_step"] if adamw["s_per_step"] else None)
    # the smoke's 4 steps prove the code path; on a GPU each arm must also have learned something
    trained = all(math.isfinite(r["final"]) and (smoke or r["final"] < r["curve"][evals[0]]) for r in rows)
    out.put("ok", trained)
    if not trained:
        out.put("why", "an arm's val loss is not finite or did not fall over the run")
