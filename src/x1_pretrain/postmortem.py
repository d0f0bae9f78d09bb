"""Draft the loss-spike post-mortem of a run from its MLflow metrics.

    python -m x1_pretrain.postmortem --mlflow-uri URI [--run-id ID] --output spike-postmortem.md

Finds the spike (the injected steps, else the steps the trainer's detector flagged, else the detector run
again over the logged losses), and writes a Markdown draft with the timeline around it, the peak loss and
grad norm against the baseline, whether clipping caught it and how many steps recovery took, plus
``spike.png`` beside it. Root cause and lessons are left for a person, clearly marked. Exit 0 when a
post-mortem was written, 1 when the run has no spike (the thresholds used are named), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core import redact
from .core.cli import guarded
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .core.names import EXPERIMENT
from .report.postmortem import NoSpike, write_postmortem


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.postmortem",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument("--mlflow-uri", required=True, help="the store the trainer logged to")
    p.add_argument("--run-id", default=None, help="default: the latest finished run")
    p.add_argument("--experiment", default=EXPERIMENT)
    p.add_argument("--output", type=Path, default=Path("spike-postmortem.md"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    def body() -> int:
        redact.warn_if_visible("--mlflow-uri", args.mlflow_uri, redact.MLFLOW_CREDENTIALS)
        try:
            done = write_postmortem(args.mlflow_uri, args.run_id, args.experiment, args.output)
        except NoSpike as e:
            print(str(e), file=sys.stderr)
            return 1
        print(f"[postmortem] {done}")
        return 0

    return guarded(body, os_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
