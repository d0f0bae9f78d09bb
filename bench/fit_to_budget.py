"""Fitting the schedule to the money, measured: when the budget runs short, does annealing to the end the money
reaches beat being cut mid-schedule, and match a schedule planned for that length from the start?

    python bench/fit_to_budget.py [--seeds 3] [--steps 240] [--cap 7]

Tiny config on the built-in demo corpus, CPU. The same simulated bill for every arm (demo/billing.py: dollars
per step, $0.02 until a third of --steps, then $0.04; so the arms compare by steps, not seconds):

  (a) cosine planned for --steps, cut by the guard when the projection passes the cap (exit 3: today's lab);
  (b) WSD (decay 25 %, 1-sqrt) with --budget-fit: the end follows the money, the decay reaches min_lr there;
  (c) cosine planned from the start for exactly the steps (b) reached (no budget guard);
  (d) the lab's cosine planned for --steps, cut only when the money is gone: at the step (b) reached, i.e. at
      (b)'s spend (its checkpoint at that step; the run is then stopped).

What each difference measures: (a) - (b) is today's guard against fitting, but (a) stops at its first
projection over the cap, so it also trains fewer steps for less money; (d) - (b) is like for like (the same
steps and dollars): what annealing to the end buys over a cosine cut where the money ends; (c) - (b): whether
fitting as it goes is as good as knowing the length in advance.

Each arm's final weights are evaluated on every window of the val split (the same windows for all), and the
script prints the val loss, steps and dollars per seed, and the mean ± std per arm.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "configs" / "x1-tiny-cpu.yaml"
STEP_S = 0.3  # the tiny config's step on the 2-core dev machine, until the trainer and the billing measure it


def tokenize(root: Path) -> Path:
    from x1_pretrain.data.demo_corpus import write_demo_corpus

    write_demo_corpus(root / "raw")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "x1_pretrain.tokenize_data",
            "--input-dir",
            str(root / "raw"),
            "--output-dir",
            str(root / "tok"),
            "--val-fraction",
            "0.1",
            "--workers",
            "2",
        ],
        check=True,
        capture_output=True,
    )
    return root / "tok"


def train(data: Path, ckpt: Path, steps: int, seed: int, *extra: str) -> tuple[int, str]:
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.train",
        "--config",
        str(TINY),
        "--data-dir",
        str(data),
        "--ckpt-dir",
        str(ckpt),
        "--total-steps",
        str(steps),
        "--seed",
        str(seed),
        "--log-every",
        "10",
        "--eval-every",
        "100000",
        "--ckpt-every",
        "100000",
        "--set",
        "optim.warmup_steps=10",
        *extra,
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def budget_flags(budget: Path, cap: float, fit: bool) -> list[str]:
    flags = [
        "--budget-cap-usd",
        str(cap),
        "--budget-alert-usd",
        str(cap * 0.9),
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-check-every-min",
        "0.05",
        "--budget-reserve-min",
        "0.02",
        "--budget-buffer-usd",
        "0",
        "--budget-expected-step-s",
        str(STEP_S),
        "--force-launch",
    ]
    return (
        [*flags, "--budget-fit", "--set", "optim.schedule=wsd", "--set", "optim.decay_fraction=0.25"] if fit else flags
    )


def billed_run(data: Path, run_dir: Path, steps: int, seed: int, cap: float, fit: bool) -> tuple[int, str, float]:
    """(exit code, output, dollars billed) of one arm under the simulated bill."""
    from x1_pretrain.demo.billing import StepBilling

    run_dir.mkdir(parents=True)
    budget = run_dir / "budget.json"
    billing = StepBilling(budget, run_dir / "ckpt", lambda s: 0.02 if s < steps // 3 else 0.04, step_s=STEP_S)
    try:
        code, out = train(data, run_dir / "ckpt", steps, seed, *budget_flags(budget, cap, fit))
    finally:
        billing.close()
    return code, out, billing.spent


def cut_where_the_money_ends(data: Path, run_dir: Path, steps: int, seed: int, cut: int) -> Path:
    """(d): the cosine planned for ``steps``, billed like the others, its weights taken at step ``cut`` (a
    checkpoint there); the process is stopped once that checkpoint is complete. Returns the step dir."""
    from x1_pretrain.demo.billing import StepBilling

    run_dir.mkdir(parents=True)
    ckpt = run_dir / "ckpt"
    want = ckpt / f"step_{cut:07d}"
    billing = StepBilling(run_dir / "budget.json", ckpt, lambda s: 0.02 if s < steps // 3 else 0.04, step_s=STEP_S)
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.train",
        "--config",
        str(TINY),
        "--data-dir",
        str(data),
        "--ckpt-dir",
        str(ckpt),
        "--total-steps",
        str(steps),
        "--seed",
        str(seed),
        "--log-every",
        "10",
        "--eval-every",
        "100000",
        "--ckpt-every",
        str(cut),
        "--set",
        "optim.warmup_steps=10",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (want / "DONE").exists() and proc.poll() is None:
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        billing.close()
    if not (want / "DONE").exists():
        raise SystemExit(f"(d) never wrote {want}")
    return want


def final_step(ckpt: Path) -> int:
    return json.loads((ckpt / (ckpt / "latest").read_text().strip() / "trainer_state.json").read_text())["step"]


def val_loss(ckpt: Path, data: Path) -> float:
    import torch

    from x1_pretrain.data.tokens import gather, open_token_data, val_starts
    from x1_pretrain.report.ckpt_source import load_model, resolve

    src = resolve(ckpt)
    model = load_model(src)
    toks = open_token_data(data, src.model.vocab_size, src.model.seq_len)
    starts = val_starts(toks.val.size, src.model.seq_len, 10**9)  # every window
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(starts), 16):
            x, y = gather(toks.val, starts[i : i + 16], src.model.seq_len)
            total += float(model(x, y)) * len(x)
            n += len(x)
    return total / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--cap", type=float, default=7.0)
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="x1-fit-bench-"))
    data = tokenize(root)
    results: dict[str, list[float]] = {"a": [], "b": [], "c": [], "d": []}
    for seed in range(args.seeds):
        d = root / f"seed{seed}"
        code_a, _, spent_a = billed_run(data, d / "a", args.steps, seed, args.cap, fit=False)
        code_b, log_b, spent_b = billed_run(data, d / "b", args.steps, seed, args.cap, fit=True)
        if code_b != 0:
            print(log_b[-3000:])
            return 1
        steps_a, steps_b = final_step(d / "a" / "ckpt"), final_step(d / "b" / "ckpt")
        code_c, _ = train(data, d / "c", steps_b, seed)
        cut = cut_where_the_money_ends(data, d / "d", args.steps, seed, steps_b)
        losses = [val_loss(p, data) for p in (d / "a" / "ckpt", d / "b" / "ckpt", d / "c", cut)]
        for k, v in zip("abcd", losses, strict=True):
            results[k].append(v)
        la, lb, lc, ld = losses
        print(
            f"seed {seed}: (a) cut at step {steps_a} (exit {code_a}, ${spent_a:.2f}) val {la:.4f} | "
            f"(b) fitted to step {steps_b} (exit {code_b}, ${spent_b:.2f}) val {lb:.4f} | "
            f"(c) cosine for {steps_b} steps (exit {code_c}) val {lc:.4f} | "
            f"(d) cosine for {args.steps} cut at step {steps_b} (b's steps and spend) val {ld:.4f}",
            flush=True,
        )
    arms = (
        ("a", "cosine, cut by the guard"),
        ("b", "wsd + --budget-fit"),
        ("c", "cosine planned for (b)'s steps"),
        ("d", "cosine cut where the money ends"),
    )
    for k, name in arms:
        v = results[k]
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        print(f"({k}) {name:32s} val loss {statistics.mean(v):.4f} ± {sd:.4f} over {len(v)} seeds")
    for k, meaning in (
        ("a", "today's guard vs fitting; (a) also trains fewer steps for less money"),
        ("d", "like for like, same steps and dollars: what annealing to the money's end buys"),
        ("c", "fitting as it goes vs knowing the length in advance; <= 0 would mean no worse"),
    ):
        diff = [x - b for x, b in zip(results[k], results["b"], strict=True)]
        print(f"({k}) - (b): {statistics.mean(diff):+.4f} nats ({meaning})")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
