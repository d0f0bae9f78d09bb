"""``--resume-from-latest`` with ``--ckpt-remote``: bring what the mirror (``ckpt/mirror.py``) keeps back to
this machine before anything reads the checkpoint dir.

The newest complete remote checkpoint (one with ``DONE``) comes down when it is newer than the newest complete
local one, into a hidden folder that is verified (``DONE`` against ``trainer_state.json``, each file against its
recorded sha256) and only then renamed into place; one that fails is named and the next older is tried. The
ledger's money comes down when the remote's has counted more than the local one (so a new machine's spend starts
from the mirrored ledger, never from zero; merged field by field, the local alert state kept), the MLflow copy
when this machine has none. The remote's exit status is never pulled (it tells of another machine's start).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..budget.ledger import LEDGER_FILE, merge, parse_text, read, spent
from ..core.contract import EXIT_INTERRUPTED, EXIT_STORE_UNAVAILABLE, EXIT_UNEXPECTED
from ..core.errors import X1Error
from ..core.fileio import fsync_dir, inside, replace_dir, write_text_atomic
from ..core.log import Log
from . import checkpoint as ck
from . import run_owner
from .mirror import MLFLOW_DB, MLFLOW_FILES, MlflowStore
from .objstore import Store, StoreError, launch_error

_HOSTILE = "x1 never writes such a key (someone with write access to the bucket did); delete it from the bucket"


class RemoteUnavailable(X1Error):
    """The remote could not be read and there is nothing local to resume from: exit 1, which the watchdog
    relaunches with backoff (starting fresh would train again what the remote may hold)."""

    exit_code = EXIT_UNEXPECTED


class _StoreDown(RemoteUnavailable):
    """The remote cannot be reached (a connection refused or timed out, a 5xx) and nothing local can be resumed
    from: ``pull_when_reachable`` waits for it."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class StoreUnavailable(X1Error):
    """The remote stayed unreachable through ``checkpoint.remote_wait_min`` with nothing local: exit 8, which the
    watchdog relaunches with backoff (not a crash loop) and SkyPilot recovers on a new VM."""

    exit_code = EXIT_STORE_UNAVAILABLE


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
        text = (
            f"--ckpt-remote {store.url} failed during the download ({e.detail}); the checkpoint dir {ckpt_dir} "
            "keeps what it had"
        )
        if e.kind == "unreachable" and _newest_local(ckpt_dir, log) < 0:
            raise _StoreDown(text, e.detail) from None
        raise RemoteUnavailable(f"{text}. Exit 1: the watchdog relaunches") from None
    except OSError as e:
        raise RemoteUnavailable(
            f"--ckpt-remote {store.url}: the download could not be written to {ckpt_dir} "
            f"({e.strerror or e}); free space there. Exit 1: the watchdog relaunches"
        ) from None


def _pull(store: Store, ckpt_dir: Path, log: Log, mlflow_store: MlflowStore | None) -> str | None:
    local = _newest_local(ckpt_dir, log)
    try:
        objects = store.list_objects("")
    except StoreError as e:
        if local >= 0:
            log(
                f"WARNING: --ckpt-remote {store.url} cannot be read ({e.detail}); resuming from the local "
                f"{ck.step_dir_name(local)}"
            )
            return None
        if e.kind == "unreachable":
            raise _StoreDown(f"--ckpt-remote {store.url} cannot be reached ({e.detail})", e.detail) from None
        raise RemoteUnavailable(
            f"--ckpt-remote {store.url} cannot be read ({e.detail}) and {ckpt_dir} holds no "
            "checkpoint: not starting fresh over a run the remote may hold. Exit 1: the "
            "watchdog relaunches; check AWS_ENDPOINT_URL and the network"
        ) from None
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    _same_run(store, ckpt_dir, objects)
    pulled = _pull_checkpoint(store, ckpt_dir, objects, local, log)
    _pull_ledger(store, ckpt_dir, objects, log)
    # the remote's exit_status.json is never pulled: it tells of an earlier machine's start, and a copy in the
    # checkpoint dir (the watchdog's fallback) must only ever be one a trainer on this disk wrote
    if mlflow_store is not None and _empty(mlflow_store.path):
        _pull_mlflow(store, objects, mlflow_store, log)
    return pulled


def _same_run(store: Store, ckpt_dir: Path, objects: dict[str, int]) -> None:
    """A checkpoint dir of another run pulls nothing from this prefix (exit 2, ``run_owner``), nor one that gives
    no proof of being the owner's run: its id is the checkpoint dir's, else ``$X1_RUN_ID`` (kept there once it
    matches). The launch checked this when the store answered then."""
    if run_owner.OWNER not in objects:
        return
    owner, mine = run_owner.remote_id(store), run_owner.identity(ckpt_dir)
    if owner is None:
        return
    if owner == mine:
        run_owner.keep_local(ckpt_dir, owner)
        return
    raise run_owner.refusal(store, owner, mine)


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
        dests = {
            rel: inside(tmp, rel[len(MLFLOW_FILES) + 1 :], f"the bucket key {store.url}/{rel} names", _HOSTILE)
            for rel in files
        }  # every key checked before anything is written
        try:
            for rel in files:
                dest = dests[rel]
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
            dests = {
                f: inside(tmp, f, f"the bucket key {store.url}/{name}/{f} names", _HOSTILE)
                for f in sorted(by_step[name])
            }
            for f, dest in dests.items():
                store.get_file(f"{name}/{f}", dest)
                size += dest.stat().st_size
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
            text = f"--ckpt-remote {store.url}: {name} could not be downloaded ({e.detail}); nothing changed locally"
            if e.kind == "unreachable" and local < 0:
                raise _StoreDown(text, e.detail) from None
            raise RemoteUnavailable(f"{text}. Exit 1: the watchdog relaunches") from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return None


def _pull_ledger(store: Store, ckpt_dir: Path, objects: dict[str, int], log: Log) -> None:
    if LEDGER_FILE not in objects:
        return
    data = store.get_bytes(LEDGER_FILE)
    if data is None:
        return
    remote, problem = parse_text(data, f"the remote {store.url}/{LEDGER_FILE}")
    if remote is None:  # a list, garbage, a negative or infinite bill: never trusted, kept for a post-mortem
        aside = ckpt_dir / f"{LEDGER_FILE}.remote-bad-{int(time.time())}"
        try:
            aside.write_bytes(data)
            kept = f" (kept as {aside.name})"
        except OSError:
            kept = ""
        log(f"budget warning: {problem}; not used{kept}; the local ledger stands")
        return
    local, _ = read(ckpt_dir / LEDGER_FILE)
    merged = merge(local, remote)  # only ever raises the money counted here; the alerts state stays this disk's
    if (local is None and spent(remote) < 0) or merged == local:
        return
    write_text_atomic(ckpt_dir / LEDGER_FILE, json.dumps(merged, indent=1) + "\n")
    log(f"remote: the cost ledger came down (${spent(merged):.2f} counted so far): the spend starts there")


# -- several processes on one node (torchrun): the first pulls, the others wait for it ------------------------
PULLED = ".remote-pulled"
PULL_WAIT_S = 3600.0  # a checkpoint of many GB over a slow link


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
    raise RemoteUnavailable(
        f"the node's first process did not finish pulling the checkpoint within {timeout_s:.0f} s;"
        " exit 1: the watchdog relaunches"
    )


# -- a store that is down when a machine starts: wait for it, bounded --------------------------------------
WAIT_FIRST_S = 5.0  # the first pause between tries; each next one doubles ...
WAIT_MAX_S = 60.0  # ... up to this
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def pull_when_reachable(
    store: Store, ckpt_dir: Path, log: Log, mlflow_store: MlflowStore | None = None, wait_min: float = 30.0
) -> str | None:
    """``pull``, waiting up to ``wait_min`` minutes for a store that cannot be reached while this machine holds no
    checkpoint (a new machine during a provider incident): tries with a growing pause (WAIT_FIRST_S doubling up to
    WAIT_MAX_S), a log line for each. Refused credentials or a missing bucket end the wait at once (exit 2);
    SIGTERM, SIGINT or SIGHUP end it cleanly (exit 75: nothing was trained); the end of the wait is exit 8."""
    deadline = time.time() + wait_min * 60
    # short timeouts and no retries inside a try: a stop signal is acted on within seconds, not botocore's minutes
    probe = Store(store.url, connect_timeout_s=5.0, read_timeout_s=20.0, attempts=1)
    tries = 0
    while True:
        try:
            return pull(store, ckpt_dir, log, mlflow_store)
        except _StoreDown as e:
            reason = e.detail
        with _stop_signals() as heard:
            tries = _wait_until_up(probe, reason, (deadline, wait_min), tries, log, heard)


def _wait_until_up(
    probe: Store, reason: str, until: tuple[float, float], tries: int, log: Log, heard: list[str]
) -> int:
    """Pause and probe until the store answers; returns the tries made so far. Raises at the deadline (exit 8),
    on a stop signal (exit 75) or when the answer is a refusal (exit 2)."""
    deadline, wait_min = until
    when = time.strftime("%H:%M:%S UTC", time.gmtime(deadline))
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise StoreUnavailable(
                f"--ckpt-remote {probe.url} at {probe.endpoint()} could not be reached for checkpoint.remote_wait_min "
                f"{wait_min:g} min ({reason}), and this machine holds no checkpoint: not starting fresh over a run "
                "the remote may hold. Exit 8: the watchdog relaunches with backoff (a managed job: a new VM); check "
                "AWS_ENDPOINT_URL, the network and the provider's status page"
            )
        pause = min(WAIT_FIRST_S * 2 ** min(tries, 16), WAIT_MAX_S, left)
        tries += 1
        log(
            f"remote: waiting for {probe.url} at {probe.endpoint()} to answer ({reason}): try {tries} in "
            f"{pause:.1f} s; giving up at {when} (checkpoint.remote_wait_min {wait_min:g}), then exit 8"
        )
        _sleep(pause, heard)
        try:
            probe.check()
        except StoreError as e:
            err = launch_error(probe, e)
            if err is not None:
                raise err from None
            reason = e.detail
        else:
            if not heard:
                log(f"remote: {probe.url} answers again after {tries} tries: resuming from it")
                return tries
        if heard:
            raise _stopped_error(heard[0])


def _sleep(seconds: float, heard: list[str]) -> None:
    end = time.monotonic() + seconds
    while not heard and time.monotonic() < end:
        time.sleep(min(0.1, max(end - time.monotonic(), 0.0)))
    if heard:
        raise _stopped_error(heard[0])


def _stopped_error(name: str) -> X1Error:
    err = X1Error(
        f"{name} heard while waiting for the checkpoint store: nothing was trained, so there is nothing to "
        "checkpoint; the remote keeps the run. Exit 75"
    )
    err.exit_code = EXIT_INTERRUPTED
    return err


@contextmanager
def _stop_signals() -> Iterator[list[str]]:
    """While waiting (before the trainer's own handlers exist): a stop signal is noted, not fatal."""
    heard: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield heard
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, lambda signum, _frame: heard.append(signal.Signals(signum).name))
    try:
        yield heard
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
