"""MLflow tracking: the only module that imports mlflow.

Metrics are buffered and sent in batches by a background thread (one ``log_batch`` per flush, never
one round-trip per scalar). A tracking server that is down does not stop training: the buffer is kept
and retried with backoff, and a single warning is printed per outage.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import names as N
from ..core import redact
from ..core.fileio import disk_full, write_text_atomic
from ..core.names import EXPERIMENT, default_mlflow_uri

_log = logging.getLogger(__name__)

_MAX_BATCH = 1000  # MLflow's limit of metrics per log_batch
_MAX_PARAMS = 100  # and of params
_MAX_BUFFER = 2_000_000  # metrics kept while the server is down (oldest dropped beyond, with a warning)
SPILL_PREFIX = "mlflow-undelivered-"


def _within(seconds: float, call: Any) -> bool:
    """Run ``call`` on a helper thread; True if it returned without error within ``seconds``."""
    ok: list[bool] = []

    def target() -> None:
        try:
            call()
            ok.append(True)
        except Exception as e:
            _warn(f"{type(e).__name__} from the tracking store")

    t = threading.Thread(target=target, name="x1-mlflow-call", daemon=True)
    t.start()
    t.join(seconds)
    return bool(ok)


def _warn(msg: str) -> None:
    _log.warning(msg)


def resolve_uri(uri: str | None, ckpt_dir: Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location for a new experiment). Default: sqlite beside the checkpoints."""
    if not uri:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        return default_mlflow_uri(ckpt_dir), (ckpt_dir.resolve() / "mlartifacts").as_uri()
    if uri.startswith("file:") or "://" not in uri:
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() != "true":
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
            _log.warning(
                "MLflow 3 keeps the file:// store behind MLFLOW_ALLOW_FILE_STORE=true; "
                "x1 set it for this run (sqlite:///path.db is MLflow's recommended store)"
            )
        return uri, None
    if uri.startswith(("sqlite:", "http://", "https://", "postgresql", "mysql", "databricks")):
        return uri, None
    raise ValueError(f"--mlflow-uri {uri!r}: expected file:///path, sqlite:///path.db or http(s)://host")


def git_commit(path: Path | None = None) -> str | None:
    here = path or Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass
class _Pending:
    metrics: deque[Any] = field(default_factory=deque)
    params: list[tuple[str, str]] = field(default_factory=list)
    tags: list[tuple[str, str]] = field(default_factory=list)


class MlflowTracker:
    """One MLflow run, created or resumed. Thread-safe buffering; ``close`` flushes."""

    def __init__(
        self,
        uri: str,
        artifact_location: str | None,
        run_name: str,
        run_id: str | None = None,
        experiment: str = EXPERIMENT,
        flush_every_s: float = 5.0,
    ) -> None:
        # Fail fast per request and retry ourselves: the trainer must not stall on a dead server.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        if redact.secrets_of(uri):  # MLflow prints "View run … at: <the URL>" at the end, password and all
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        for name in ("alembic", "mlflow.tracking"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # its traceback at every retry (a full disk under sqlite: one a second); _note_down says it once
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        from mlflow import MlflowClient

        self.uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        self._artifact_location = artifact_location
        self._experiment = experiment
        self._run_name = run_name
        self.run_id: str | None = run_id
        self._pending = _Pending()
        self._lock = threading.Lock()  # guards the pending buffers
        self._send_lock = threading.Lock()  # one sender at a time (background thread or flush)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_every = flush_every_s
        self._down_since: float | None = None
        self._disk_full = False  # the last failure was the store's full disk
        self._dropped = 0
        self.resumed = run_id is not None
        # The first contact (create or reopen the run) is bounded too: a server that accepts connections and
        # never answers must not hold the trainer at its start; the sender thread keeps trying.
        if not _within(float(os.environ.get("X1_MLFLOW_START_TIMEOUT_S", "20")), self._first_contact):
            self._note_down(TimeoutError("no answer to the first request"))
        self._thread = threading.Thread(target=self._loop, name="x1-mlflow", daemon=True)
        self._thread.start()

    # -- run creation (may be deferred while the server is unreachable) --
    def _first_contact(self) -> None:
        with self._send_lock:
            self._ensure_run()

    def _ensure_run(self) -> bool:
        if self.run_id is not None and not getattr(self, "_run_checked", False):
            try:
                self._client.update_run(self.run_id, status="RUNNING")
                self._run_checked = True
            except Exception as e:
                if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                    _warn(f"run {self.run_id} from the checkpoint is not in {redact.url(self.uri)}; starting a new run")
                    self.run_id = None
                    self.resumed = False
                    return self._ensure_run()
                self._note_down(e)
                return False
            return True
        if self.run_id is not None:
            return True
        try:
            exp = self._client.get_experiment_by_name(self._experiment)
            exp_id = (
                exp.experiment_id
                if exp
                else self._client.create_experiment(self._experiment, artifact_location=self._artifact_location)
            )
            run = self._client.create_run(exp_id, run_name=self._run_name)
            self.run_id = run.info.run_id
            self._run_checked = True
            return True
        except Exception as e:
            self._note_down(e)
            return False

    def _note_down(self, e: Exception) -> None:
        self._disk_full = disk_full(e)
        if self._down_since is None:
            self._down_since = time.monotonic()
            why = redact.scrub(str(e), self.uri)[:200]
            _warn(
                f"tracking server {redact.url(self.uri)} unreachable ({type(e).__name__}: {why}); "
                "training continues, metrics are buffered and retried"
            )

    # -- public API --
    @property
    def reachable(self) -> bool:
        """False while the server is known to be down (sends are failing)."""
        return self._down_since is None

    def log_params(self, params: dict[str, Any]) -> None:
        with self._lock:
            self._pending.params.extend((k, str(v)[:6000]) for k, v in params.items())
        self._wake.set()

    def set_tags(self, tags: dict[str, Any]) -> None:
        with self._lock:
            self._pending.tags.extend((k, str(v)[:5000]) for k, v in tags.items())
        self._wake.set()

    def log_metrics(self, step: int, metrics: dict[str, float], timestamp_ms: int | None = None) -> None:
        from mlflow.entities import Metric

        ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None and math.isfinite(float(v))]
        with self._lock:
            self._pending.metrics.extend(items)
            overflow = len(self._pending.metrics) - _MAX_BUFFER
            for _ in range(max(overflow, 0)):
                self._pending.metrics.popleft()
                self._dropped += 1

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Synchronous (rare, small files). Failure warns and returns."""
        if not self._send_lock.acquire(timeout=10.0):  # the sender may be creating the run, or stuck
            _warn(f"could not store artifact {path.name} (the tracking store is not answering)")
            return
        try:
            if not self._ensure_run() or self.run_id is None:
                return
            self._client.log_artifact(self.run_id, str(path), artifact_path)
        except Exception as e:
            why = redact.scrub(str(e), self.uri)[:200]
            _warn(f"could not store artifact {path.name} ({type(e).__name__}: {why})")
        finally:
            self._send_lock.release()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Send everything buffered now; True when the buffer is empty afterwards. Returns within ``timeout_s``
        even when the sender thread is stuck in a request to a server that never answers."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._send_once(timeout_s=left):
                return True
            if self._disk_full:  # the store's disk (often the checkpoints' own) is full: no use waiting on it
                return False
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))

    def close(self, status: str = "FINISHED", timeout_s: float | None = None, spill_dir: Path | None = None) -> None:
        """Flush and end the run, all within ``timeout_s`` (default $X1_MLFLOW_CLOSE_TIMEOUT_S or 30 s).

        Metrics still undelivered are written to ``spill_dir/mlflow-undelivered-<pid>.jsonl``; the next process
        of the run (``--resume-from-latest``) sends them again (:meth:`redeliver`).
        """
        if timeout_s is None:
            timeout_s = float(os.environ.get("X1_MLFLOW_CLOSE_TIMEOUT_S", "30"))
        deadline = time.monotonic() + max(timeout_s, 0.0)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=max(deadline - time.monotonic(), 0.0))
        if not self.flush(max(deadline - time.monotonic(), 0.0)):
            self._spill(spill_dir)
        if self.run_id is not None:
            run_id = self.run_id
            ok = _within(
                max(deadline - time.monotonic(), 0.5), lambda: self._client.set_terminated(run_id, status=status)
            )
            if not ok:
                _warn(f"could not mark the run {status} in time (the next resume marks it RUNNING again)")

    def _spill(self, spill_dir: Path | None) -> None:
        with self._lock:
            left = list(self._pending.metrics)
        if not left:
            return
        where = ""
        if spill_dir is not None:
            path = spill_dir / f"{SPILL_PREFIX}{os.getpid()}.jsonl"
            lines = "".join(
                json.dumps(
                    {"key": m.key, "value": m.value, "step": m.step, "timestamp": m.timestamp, "run_id": self.run_id}
                )
                + "\n"
                for m in left
            )
            try:  # whole or not at all (a full disk): a cut line would make the resume skip the file
                spill_dir.mkdir(parents=True, exist_ok=True)
                earlier = path.read_text() if path.is_file() else ""
                write_text_atomic(path, earlier + lines)
                where = f"; saved to {path} (sent again when the run resumes)"
            except OSError as e:
                where = (
                    f"; they could not be saved either ({e}): the resumed run logs again the steps after its "
                    "checkpoint, the metrics of earlier steps are lost"
                )
        _warn(f"{len(left)} metrics could not be delivered to {redact.url(self.uri)} before exit{where}")

    def redeliver(self, spill_dir: Path, up_to_step: int) -> int:
        """Queue the metrics an earlier process of this run could not deliver (its spill files), up to the step
        it resumes from (later steps are replayed and logged again); returns how many. The files are removed:
        what is queued now is spilled again if it cannot be delivered either."""
        from mlflow.entities import Metric

        count = 0
        for path in sorted(spill_dir.glob(f"{SPILL_PREFIX}*.jsonl")):
            items = []
            try:
                for line in path.read_text().splitlines():
                    r = json.loads(line)
                    if r.get("run_id") in (None, self.run_id) and int(r["step"]) <= up_to_step:
                        items.append(Metric(str(r["key"]), float(r["value"]), int(r["timestamp"]), int(r["step"])))
            except (OSError, ValueError, KeyError, TypeError) as e:
                _warn(f"{path} could not be read ({e}); left in place")
                continue
            with self._lock:
                self._pending.metrics.extend(items)
            count += len(items)
            path.unlink(missing_ok=True)
        if count:
            self._wake.set()
        return count

    # -- background sending --
    def _send_once(self, timeout_s: float | None = None) -> bool:
        # a bounded wait for the lock: the sender thread may be stuck in a request that never returns
        if not self._send_lock.acquire(timeout=-1 if timeout_s is None else max(timeout_s, 0.0)):
            return False
        try:
            return self._send_locked()
        finally:
            self._send_lock.release()

    def _send_locked(self) -> bool:
        with self._lock:
            if not (self._pending.metrics or self._pending.params or self._pending.tags):
                return True
        if not self._ensure_run() or self.run_id is None:
            return False
        from mlflow.entities import Param, RunTag

        try:
            with self._lock:
                params = list(self._pending.params)
                tags = list(self._pending.tags)
            for i in range(0, len(params), _MAX_PARAMS):
                self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in params[i : i + _MAX_PARAMS]])
            if tags:
                self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags])
            with self._lock:
                del self._pending.params[: len(params)]
                del self._pending.tags[: len(tags)]
            while True:
                with self._lock:
                    batch = [self._pending.metrics[i] for i in range(min(_MAX_BATCH, len(self._pending.metrics)))]
                if not batch:
                    break
                self._client.log_batch(self.run_id, metrics=batch)
                with self._lock:
                    for _ in batch:
                        self._pending.metrics.popleft()
        except Exception as e:
            self._note_down(e)
            return False
        self._disk_full = False
        if self._down_since is not None:
            _log.info(
                f"tracking server reachable again after {time.monotonic() - self._down_since:.0f} s; "
                "buffered metrics delivered"
            )
            self._down_since = None
        if self._dropped:
            _warn(f"{self._dropped} oldest metrics were dropped while the server was unreachable")
            self._dropped = 0
        return True

    def _loop(self) -> None:
        backoff = self._flush_every
        while not self._stop.is_set():
            self._wake.wait(backoff)
            self._wake.clear()
            if self._stop.is_set():
                return
            ok = self._send_once()
            backoff = self._flush_every if ok else min(backoff * 2, 60.0)


def run_tags(device_name: str) -> dict[str, str]:
    tags = {N.TAG_HOST: socket.gethostname(), N.TAG_DEVICE: device_name}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit.removesuffix("-dirty")
        tags[N.TAG_GIT_COMMIT] = commit
    return tags


class NullTracker:
    """The tracker of ranks other than 0: they train, rank 0 alone reports."""

    run_id: str | None = None
    uri = ""
    reachable = True
    resumed = False

    def log_params(self, params: dict[str, Any]) -> None:
        return None

    def set_tags(self, tags: dict[str, Any]) -> None:
        return None

    def log_metrics(self, step: int, metrics: dict[str, float], timestamp_ms: int | None = None) -> None:
        return None

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        return None

    def flush(self, timeout_s: float = 30.0) -> bool:
        return True

    def close(self, status: str = "FINISHED", timeout_s: float | None = None, spill_dir: Path | None = None) -> None:
        return None

    def redeliver(self, spill_dir: Path, up_to_step: int) -> int:
        return 0
