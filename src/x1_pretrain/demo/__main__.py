"""``make demo``: the whole job end to end on the built-in demo corpus, on whatever device is here.

1. write CPython's pydoc topics as a parquet shard (real English prose every Python install carries) and
   tokenize it with the lab's command;
2. act 1: train the tiny config under the watchdog with a spot preemption half-way and an injected loss
   spike and task scores at the end, score the final weights again with evaluate, export the bundle, draft
   the post-mortem and print the Definition-of-Done table;
3. act 2: the budget runs short half-way: a WSD run with --budget-fit anneals and finishes inside the
   cap, and the DoD table reads its spend.

Everything lands in ``demo-run/`` (or ``--out``); run it again to start over.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from ..core.log import add_flag as add_log_level
from ..core.log import setup as setup_logging
from ..data.demo_corpus import write_demo_corpus
from . import acts as acts_module
from .acts import act_budget_runs_short, act_preemption_and_spike, run

REPO_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "x1-tiny-cpu.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m x1_pretrain.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(ap)
    ap.add_argument("--out", type=Path, default=Path("demo-run"))
    ap.add_argument("--config", type=Path, default=REPO_CONFIG)
    ap.add_argument("--total-steps", type=int, default=300)
    ap.add_argument("--acts", default="1,2", help="which acts to play (default 1,2)")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    acts_module.LOG_LEVEL[0] = args.log_level
    out: Path = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    shard = write_demo_corpus(out / "raw")
    print(f"[demo] demo corpus: {shard}")
    data = out / "data"
    code = run(
        [
            sys.executable,
            "-m",
            "x1_pretrain.tokenize_data",
            "--input-dir",
            str(out / "raw"),
            "--output-dir",
            str(data),
            "--tokenizer",
            "gpt2",
            "--val-fraction",
            "0.1",
            "--workers",
            "2",
        ]
    )
    acts = {a.strip() for a in args.acts.split(",")}
    if code == 0 and "1" in acts:
        code = act_preemption_and_spike(args.config, data, out, args.total_steps)
    if code == 0 and "2" in acts:
        code = act_budget_runs_short(args.config, data, out / "budget-act", args.total_steps)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
