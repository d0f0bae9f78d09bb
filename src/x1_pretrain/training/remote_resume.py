"""``--resume-from-latest`` with ``--ckpt-remote``: bring what the mirror (``training/mirror.py``) keeps back to
this machine before anything reads the checkpoint dir.

The newest complete remote checkpoint (one with ``DONE``) comes down when it is newer than the newest complete
local one, into a hidden folder that is verified (``DONE`` against ``trainer_state.json``, each file against its
recorded sha256) and only then renamed into place; one that fails is named and the next older is tried. The
ledger comes down when the remote's has counted more money than the local one (so a new machine's spend starts
from the mirrored ledger, never from zero), the exit status and the sqlite MLflow copy when this machine has none.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..budget.ledger import LEDGER_FILE, read
from ..core.errors import EXIT_UNEXPECTED, X1Error
from ..core.fileio import fsync_dir, replace_dir, write_text_atomic
from ..core.objstore import Store, StoreError
from . import checkpoint as ck
from .mirror import MLFLOW_DB, MLFLOW_FILES, MlflowStore

Log = Callable[[str], None]


class RemoteUnavailable(X1Error):
    """The remote could not be read and there is nothing local to resume from: exit 1, which the watchdog
    relaunches with backoff (starting fresh would train again what the remote may hold)."""

    exit_code = EXIT_UNEXPECTED


def _newest_local(ckpt_dir: Path, log: Log) -> int:
    found = ck.find_latest_complete(ckpt_dir, lambda m: log(f"warning: {m}"))
    return found.step if found is not None else -1


def pull(store: Store, ckpt_dir: Path, log: Log, mlflow_store: MlflowStore | None = None) -> str | None:
    """Bring the remote's newest complete checkpoint (when newer than the local one), its ledger, exit status
    and MLflow copy into ``ckpt_dir``. Returns the step dir pulled, or None. A store that fails midway or a disk
    that fills is RemoteUnavailable (exit 1); what was half-downloaded is removed."""
    try:
        return _pull(store, ckpt_dir, log, mlflow_store)
    except StoreError as e:
        raise RemoteUnavailable(f"--ckpt-remote {store.url} failed during the download ({e.detail}); the checkpoint "
                                f"dir {ckpt_dir} keeps what it had. Exit 1: the watchdog relaunches") from None
    except OSError as e:
        raise RemoteUnavailable(f"--ckpt-remote {store.url}: the download could not be written to {ckpt_dir} "
                                f"({e.strerror or e}); free space there. Exit 1: the watchdog relaunches") from None


def _pull(store: Store, ckpt_dir: Path, log: Log, mlflow_store: MlflowStore | None) -> str | None:
    local = _newest_local(ckpt_dir, log)
    try:
        objects = store.list_objects("")
    except StoreError as e:
        if local >= 0:
            log(f"WARNING: --ckpt-remote {store.url} cannot be read ({e.detail}); resuming from the local "
                f"{ck.step_dir_name(local)}")
            return None
        raise RemoteUnavailable(f"--ckpt-remote {store.url} cannot be read ({e.detail}) and {ckpt_dir} holds no "
                                "checkpoint: not starting fresh over a run the remote may hold. Exit 1: the "
                                "watchdog relaunches; check AWS_ENDPOINT_URL and the network") from None
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    pulled = _pull_checkpoint(store, ckpt_dir, objects, local, log)
    _pull_ledger(store, ckpt_dir, objects, log)
    if ck.EXIT_STATUS in objects and not (ckpt_dir / ck.EXIT_STATUS).exists():
        _download(store, ck.EXIT_STATUS, ckpt_dir / ck.EXIT_STATUS)
    if mlflow_store is not None and _empty(mlflow_store.path):
        _pull_mlflow(store, objects, mlflow_store, log)
    return pulled


def _empty(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and not any(path.iterdir()))


def _pull_mlflow(store: Store, objects: dict[str, int], where: MlflowStore, log: Log) -> None:
    files = sorted(k for k in objects if k.startswith(MLFLOW_FILES + "/"))
    target = where.path
    if where.sqlite and MLFLOW_DB in objects:
        target.parent.mkdir(parents=True, exist_ok=True)
        _download(store, MLFLOW_DB, target)
    elif files and not where.sqlite:
        tmp = target.with_name(f".{target.name}.pull-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for rel in files:
                dest = tmp / rel[len(MLFLOW_FILES) + 1:]
                dest.parent.mkdir(parents=True, exist_ok=True)
                store.get_file(rel, dest)
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    else:
        return
    log(f"remote: the run's MLflow store came down to {target} (its copy at the last checkpoint)")


def _download(store: Store, rel: str, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.pull-{os.getpid()}")
    try:
        store.get_file(rel, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _pull_checkpoint(store: Store, ckpt_dir: Path, objects: dict[str, int], local: int, log: Log) -> str | None:
    by_step: dict[str, list[str]] = {}
    for rel in objects:
        step_name, _, name = rel.partition("/")
        if ck.STEP_RE.match(step_name) and name and "/" not in name:
            by_step.setdefault(step_name, []).append(name)
    complete = sorted((s for s, names in by_step.items() if ck.DONE_FILE in names), reverse=True)
    newer = [s for s in complete if int(s[5:]) > local]
    if not newer:
        if local >= 0 and complete:
            log(f"remote: {store.url} holds nothing newer than the local {ck.step_dir_name(local)}")
        return None
    for name in newer:
        tmp = ckpt_dir / f".{name}.pull-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            size = 0
            for f in sorted(by_step[name]):
                store.get_file(f"{name}/{f}", tmp / f)
                size += (tmp / f).stat().st_size
            fsync_dir(tmp)
            state, problem = ck.verify(tmp)
            if state is None:
                log(f"warning: remote {name} fails verification ({problem}); trying an older one")
                continue
            replace_dir(tmp, ckpt_dir / name)
            fsync_dir(ckpt_dir)
            write_text_atomic(ckpt_dir / ck.LATEST, name + "\n")
            log(f"remote: {name} came down from {store.url} ({size / 1e6:,.1f} MB, every hash verified)")
            return name
        except StoreError as e:
            raise RemoteUnavailable(f"--ckpt-remote {store.url}: {name} could not be downloaded ({e.detail}); "
                                    "nothing was changed locally. Exit 1: the watchdog relaunches") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return None


def _spent(blob: dict | None) -> float:
    memory = (blob or {}).get("memory") or {}
    value = memory.get("spent_usd")
    return float(value) if isinstance(value, (int, float)) else -1.0


def _pull_ledger(store: Store, ckpt_dir: Path, objects: dict[str, int], log: Log) -> None:
    if LEDGER_FILE not in objects:
        return
    data = store.get_bytes(LEDGER_FILE)
    if data is None:
        return
    try:
        remote = json.loads(data)
    except ValueError:
        log(f"warning: the remote {LEDGER_FILE} is not JSON; the local ledger stands")
        return
    local, _ = read(ckpt_dir / LEDGER_FILE)
    if _spent(remote) > _spent(local):
        write_text_atomic(ckpt_dir / LEDGER_FILE, json.dumps(remote, indent=1) + "\n")
        log(f"remote: the cost ledger came down (${_spent(remote):.2f} counted so far): the spend starts there")


# -- several processes on one node (torchrun): the first pulls, the others wait for it ------------------------
PULLED = ".remote-pulled"
PULL_WAIT_S = 3600.0     # a checkpoint of many GB over a slow link


def _launch_token() -> str:
    """The same for every process of one torchrun launch (and restart), different for the next."""
    keys = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT")
    return "/".join(os.environ.get(k, "") for k in keys)


@contextmanager
def pulled_marker(ckpt_dir: Path, others_wait: bool) -> Iterator[None]:
    """Around the pull of a node's first process: ``<ckpt-dir>/.remote-pulled`` says to the others of this launch
    that it is done, and whether it worked (they then exit with the same code)."""
    if not others_wait:
        yield
        return
    outcome: dict[str, Any] = {"token": _launch_token(), "ok": True}
    try:
        yield
    except X1Error as e:
        outcome.update(ok=False, error=str(e).splitlines()[0], code=e.exit_code)
        raise
    finally:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ckpt_dir / PULLED, json.dumps(outcome))


def wait_for_pull(ckpt_dir: Path, log: Log, timeout_s: float = PULL_WAIT_S, every_s: float = 0.2) -> None:
    """Wait (the other processes of a node) until the first one has pulled: its marker of this launch, written
    after this process started. Its failure is raised here with its exit code."""
    token, since = _launch_token(), time.time() - 5.0
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            marker = ckpt_dir / PULLED
            data = json.loads(marker.read_text()) if marker.stat().st_mtime >= since else None
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and data.get("token") == token:
            if data.get("ok"):
                return
            err = RemoteUnavailable(f"the node's first process could not pull from the remote: {data.get('error')}")
            err.exit_code = int(data.get("code") or EXIT_UNEXPECTED)
            raise err
        time.sleep(every_s)
    raise RemoteUnavailable(f"the node's first process did not finish pulling the checkpoint within {timeout_s:.0f} s;"
                            " exit 1: the watchdog relaunches")

