"""Names other programs and files depend on (see docs/architecture.md, contracts)."""

from __future__ import annotations

from pathlib import Path

EXPERIMENT = "x1-pretraining"   # the MLflow experiment a run logs to unless --experiment says otherwise


def default_mlflow_uri(ckpt_dir: Path) -> str:
    """The trainer's MLflow store when no --mlflow-uri is given: sqlite beside the checkpoints."""
    return f"sqlite:///{ckpt_dir.resolve() / 'mlflow.db'}"
