"""Export a finished run into a self-contained bundle (the lab's "Logs a registrar" step).

    python -m x1_pretrain.export_run --mlflow-uri file:///workspace/mlruns \\
        --output experiments/X1-pretraining/run-cloud/

Writes into the output dir: manifest.json, metrics.csv (step,name,value,timestamp_ms), loss-curve.png,
gradnorm-curve.png, throughput.png, final.safetensors and mlflow-run-uri.txt. The bundle is built in a
temporary dir and renamed into place, so a failure never leaves a half-written bundle; files already in
the output dir that are not part of the bundle (spike-postmortem.md, the termination screenshot) are kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .core import redact
from .core.cli import guarded, old_spelling
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .report.bundle import export, summary
from .report.runs import EXPERIMENT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.export_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument(
        "--mlflow-uri",
        required=True,
        help="the store the trainer logged to (file:///…, sqlite:///…, http(s)://…; credentials in "
        "MLFLOW_TRACKING_USERNAME/PASSWORD, not the URL: the bundle shows it masked)",
    )
    p.add_argument("--output", required=True, type=Path, help="bundle directory (created; replaced with --overwrite)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--run-id", help="the MLflow run to export (default: the latest finished run)")
    which.add_argument(
        "--experiment",
        default=EXPERIMENT,
        help=f"experiment to take the latest finished run from (default {EXPERIMENT})",
    )
    p.add_argument("--ckpt-dir", type=Path, help="where the checkpoints are now, if not where the run's tags say")
    old_spelling(
        p,
        "--budget-json",
        p.add_argument(
            "--budget-curr-cost-uri",
            dest="curr_cost_uri",
            help="the billing sidecar's final budget.json, as the trainer's flag of the same name (default: the run's, "
            "else the snapshot in the final checkpoint; was --budget-json)",
        ),
    )
    p.add_argument(
        "--spent-usd",
        type=float,
        help="total dollars spent, for a run without a budget guard (e.g. the provider's invoice; 0 for a local run)",
    )
    p.add_argument("--provider", help="cloud provider for the manifest (default: from budget.json when it says)")
    p.add_argument("--instance-type", help="instance type for the manifest, e.g. gpu_1x_a100_sxm4")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export in --output")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    def body() -> int:
        redact.warn_if_visible("--mlflow-uri", args.mlflow_uri, redact.MLFLOW_CREDENTIALS)
        redact.warn_if_visible("--budget-curr-cost-uri", args.curr_cost_uri, redact.BUDGET_CREDENTIALS)
        out = export(args)
        print(summary(out))
        return 0

    return guarded(body)


if __name__ == "__main__":
    raise SystemExit(main())
