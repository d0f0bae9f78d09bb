"""Read a finished run back out of MLflow (for ``export_run``).

The second module allowed to import mlflow (``tracking.py`` writes, this one only reads); mlflow is
imported inside the functions so that importing this module stays cheap.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import redact
from ..core.contract import EXIT_UNEXPECTED
from ..core.errors import X1Error
from ..core.names import EXPERIMENT


@dataclass(frozen=True)
class MetricPoint:
    name: str
    step: int
    value: float
    timestamp_ms: int


class StoreUnreadable(X1Error):
    """The store answered with an error or not at all (exit 1: worth another try); no secret in the text."""

    exit_code = EXIT_UNEXPECTED


@dataclass
class RunRecord:
    uri: str  # the store as it may be shown: userinfo and query values masked (redact.url)
    run_id: str
    experiment_id: str
    experiment_name: str
    run_name: str
    status: str
    start_ms: int | None
    end_ms: int | None
    params: dict[str, str]
    tags: dict[str, str]
    metrics: list[MetricPoint] = field(default_factory=list)

    def history(self, name: str) -> list[MetricPoint]:
        """The points of one metric in step order (one per step: see :func:`dedupe`)."""
        return sorted((m for m in self.metrics if m.name == name), key=lambda m: (m.step, m.timestamp_ms))


def store_uri(uri: str) -> str:
    """Validate a tracking URI for reading and point file stores at an existing directory.

    ``file://`` stores need ``MLFLOW_ALLOW_FILE_STORE=true`` under MLflow 3 (set here, as the trainer does).
    A local store that does not exist is an error rather than a silently created empty store.
    """
    if uri.startswith("file:") or "://" not in uri:
        path = Path(uri[len("file://") :] if uri.startswith("file://") else uri.removeprefix("file:"))
        if not path.is_dir():
            raise X1Error(
                f"--mlflow-uri {redact.url(uri)}: {path} is not a directory; give the store the trainer "
                "logged to (its --mlflow-uri, e.g. file:///workspace/mlruns)"
            )
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        return path.resolve().as_uri()
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])
        if not path.is_file():
            raise X1Error(
                f"--mlflow-uri {redact.url(uri)}: {path} does not exist; the trainer's default store is "
                "sqlite:///<ckpt-dir>/mlflow.db"
            )
        return uri
    if uri.startswith(("http://", "https://", "postgresql", "mysql", "databricks")):
        return uri
    raise X1Error(f"--mlflow-uri {redact.url(uri)!r}: expected file:///path, sqlite:///path.db or http(s)://host")


def _client(uri: str) -> Any:
    for name in ("alembic", "mlflow.store.db.utils", "mlflow.tracking", "mlflow.store"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _pick_run(client: Any, uri: str, run_id: str | None, experiment: str) -> Any:
    """The run to read; ``uri`` is the store as shown (redacted)."""
    if run_id:
        try:
            return client.get_run(run_id)
        except Exception as e:
            raise X1Error(
                f"--run-id {run_id}: no such run in {uri} ({type(e).__name__}); list the runs with "
                f"the MLflow UI or omit --run-id to take the latest finished run"
            ) from None
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise X1Error(f"--experiment {experiment!r}: not in {uri} (experiments there: {', '.join(names) or 'none'})")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.end_time DESC"], max_results=200)
    finished = [r for r in runs if r.info.status == "FINISHED"]
    if not finished:
        seen = ", ".join(f"{r.info.run_id} ({r.info.status})" for r in runs[:5]) or "no runs at all"
        raise X1Error(
            f"experiment {experiment!r} in {uri} has no finished run ({seen}); "
            "pass --run-id ID to export a particular run"
        )
    return finished[0]


def load_run(uri: str, run_id: str | None = None, experiment: str = EXPERIMENT) -> RunRecord:
    """The run (``run_id``, or the latest finished run of ``experiment``) with every metric point."""
    uri = store_uri(uri)
    shown = redact.url(uri) or uri
    try:
        client = _client(uri)
        run = _pick_run(client, shown, run_id, experiment)
        info = run.info
        exp = client.get_experiment(info.experiment_id)
        points: list[MetricPoint] = []
        for name in sorted(run.data.metrics):
            for m in client.get_metric_history(info.run_id, name):
                points.append(MetricPoint(name, int(m.step), float(m.value), int(m.timestamp)))
    except X1Error:
        raise
    except Exception as e:  # MLflow's messages carry the request URL, userinfo included
        why = redact.scrub(f"{type(e).__name__}: {e}", uri)[:300]
        raise StoreUnreadable(
            f"--mlflow-uri {shown} could not be read ({why}); check the address and the "
            "credentials (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD)"
        ) from None
    return RunRecord(
        uri=shown,
        run_id=info.run_id,
        experiment_id=info.experiment_id,
        experiment_name=exp.name,
        run_name=info.run_name or "",
        status=info.status,
        start_ms=info.start_time,
        end_ms=info.end_time,
        params=dict(run.data.params),
        tags=dict(run.data.tags),
        metrics=points,
    )


def dedupe(points: list[MetricPoint]) -> tuple[list[MetricPoint], int]:
    """One point per (name, step), the last logged; returns (points sorted by step and name, number dropped).

    A resumed run replays the steps after its last checkpoint and logs them again (same values, later
    timestamps); the replay is the history the final weights came from.
    """
    last: dict[tuple[str, int], MetricPoint] = {}
    for p in sorted(points, key=lambda p: p.timestamp_ms):
        last[(p.name, p.step)] = p
    out = sorted(last.values(), key=lambda p: (p.step, p.name))
    return out, len(points) - len(out)
