"""Check the lab's six Definition-of-Done items on an exported run bundle (reads files only, no MLflow).

    python -m x1_pretrain.dod --run-dir experiments/X1-pretraining/run-cloud [--val-band 3.20 3.50]
        [--budget-cap-usd 35] [--termination-proof NAME] [--json]

1. manifest.json exists with seed, versions, cluster and dollars spent
2. the final val loss is inside the band
3. final.safetensors reloads and re-saves byte-identically, and is the checkpoint it came from
4. total spend <= the cap
5. spike-postmortem.md is present and not empty
6. a screenshot proving the instance was terminated is in the run dir (termination*.png|jpg|jpeg|pdf)

Exit 0 only when every check passes; 1 when any fails; 2 for a usage mistake (no such run dir).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .core.contract import EXIT_USAGE
from .core.errors import X1Error
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .report.dod import EXIT_FAILED, load_manifest, notes, run_checks, table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.dod", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(p)
    p.add_argument("--run-dir", required=True, type=Path, help="the exported bundle (export_run --output)")
    p.add_argument(
        "--val-band",
        nargs=2,
        type=float,
        default=[3.20, 3.50],
        metavar=("LOW", "HIGH"),
        help="final val loss band (default: the lab's 3.20 3.50)",
    )
    p.add_argument("--budget-cap-usd", type=float, default=35.0, help="the dollar cap (default: the lab's 35)")
    p.add_argument(
        "--termination-proof",
        metavar="NAME",
        help="the screenshot file (default: any termination*.png|jpg|jpeg|pdf in the run dir)",
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        if not args.run_dir.is_dir():
            raise X1Error(
                f"--run-dir {args.run_dir} is not a directory; export the run first: python -m "
                f"x1_pretrain.export_run --mlflow-uri URI --output {args.run_dir}"
            )
        lo, hi = args.val_band
        if lo > hi:
            raise X1Error(f"--val-band {lo} {hi}: LOW must not exceed HIGH")
        checks = run_checks(args.run_dir, (lo, hi), args.budget_cap_usd, args.termination_proof)
        extra = notes(load_manifest(args.run_dir)[0], (lo, hi))
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    ok = all(c.passed for c in checks)
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(args.run_dir.resolve()),
                    "passed": ok,
                    "checks": [asdict(c) for c in checks],
                    "notes": extra,
                },
                indent=1,
            )
        )
    else:
        print("\n".join([table(checks, args.run_dir), *(f"note: {n}" for n in extra)]))
    return 0 if ok else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
