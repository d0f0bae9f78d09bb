"""One real run (tiny config, real file MLflow store, a resume, a budget guard) and its export, built once
per test session and shared by tests/test_export_run.py and tests/test_dod.py."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .conftest import FAST, TINY, shared_build

STEPS, FIRST_LEG, RESTARTS = 6, 3, 1
LOG_EVERY, EVAL_EVERY = 2, 3
SPENT_IN_CHECKPOINT, SPENT_AT_EXPORT = 12.34, 13.5


@dataclass(frozen=True)
class BuiltRun:
    root: Path
    ckpt: Path
    mlruns: Path
    budget: Path
    bundle: Path
    export_stdout: str

    @property
    def uri(self) -> str:
        return self.mlruns.as_uri()


def train_args(data: Path, ckpt: Path, mlruns: Path, budget: Path, steps: int) -> list[str]:
    return [
        "--config",
        str(TINY),
        "--data-dir",
        str(data),
        "--ckpt-dir",
        str(ckpt),
        "--mlflow-uri",
        mlruns.as_uri(),
        "--total-steps",
        str(steps),
        "--log-every",
        str(LOG_EVERY),
        "--eval-every",
        str(EVAL_EVERY),
        "--ckpt-every",
        str(EVAL_EVERY),
        "--budget-cap-usd",
        "35",
        "--budget-curr-cost-uri",
        str(budget),
        *FAST,
    ]


def train_overrides() -> dict[str, float]:
    """The flag overrides the run was trained with (for rebuilding its resolved config in a test)."""
    return {
        "train.total_steps": STEPS,
        "train.log_every": LOG_EVERY,
        "train.eval_every": EVAL_EVERY,
        "checkpoint.every_steps": EVAL_EVERY,
        "budget.cap_usd": 35.0,
    }


def write_budget(path: Path, spent: float) -> None:
    path.write_text(
        json.dumps(
            {
                "spent_usd": spent,
                "rate_usd_per_hr": 1.10,
                "hours_elapsed": spent / 1.10,
                "projected_total_usd": 30.0,
                "provider": "lambda",
                "last_update_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )


def build(tmp_path_factory, data: Path) -> BuiltRun:
    """Train 3 steps, resume to 6 as the watchdog's first relaunch would, then export (once per session)."""
    root = shared_build(tmp_path_factory, "built-run", lambda d: _build(d, data))
    return BuiltRun(
        root,
        root / "checkpoints",
        root / "mlruns",
        root / "budget.json",
        root / "experiments" / "X1-pretraining" / "run-cloud",
        (root / "export.out").read_text(),
    )


def _build(root: Path, data: Path) -> None:
    from x1_pretrain import export_run, train

    ckpt, mlruns, budget = root / "checkpoints", root / "mlruns", root / "budget.json"
    write_budget(budget, SPENT_IN_CHECKPOINT)
    assert train.main(train_args(data, ckpt, mlruns, budget, FIRST_LEG)) == 0
    old = os.environ.get("X1_RESTART_COUNT")
    os.environ["X1_RESTART_COUNT"] = str(RESTARTS)
    try:
        code = train.main(
            [*train_args(data, ckpt, mlruns, budget, STEPS), "--resume-from-latest", "--allow-config-change"]
        )  # the second leg changes train.total_steps
    finally:
        if old is None:
            os.environ.pop("X1_RESTART_COUNT", None)
        else:
            os.environ["X1_RESTART_COUNT"] = old
    assert code == 0
    write_budget(budget, SPENT_AT_EXPORT)  # the sidecar kept counting after the last checkpoint
    bundle = root / "experiments" / "X1-pretraining" / "run-cloud"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = export_run.main(
            ["--mlflow-uri", mlruns.as_uri(), "--output", str(bundle) + "/", "--instance-type", "gpu_1x_a100_sxm4"]
        )
    assert code == 0, out.getvalue()
    (root / "export.out").write_text(out.getvalue())
