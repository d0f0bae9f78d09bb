"""The checkpoint mirror: every complete checkpoint, the cost ledger, the exit status and a consistent copy of
the sqlite MLflow store, uploaded to ``--ckpt-remote s3://BUCKET/PREFIX`` off the training thread.

The remote has the local dir's layout (``step_NNNNNNN/…``, ``latest``, ``budget_ledger.json``,
``exit_status.json``, the MLflow store), so any S3 tool reads it. A checkpoint goes up in the order that keeps the
remote readable whatever moment the machine dies at: its old ``DONE`` (if a resumed run writes the step again)
is deleted first, then each file, then ``DONE``, then ``latest``; a reader never sees a ``latest`` or a
``DONE`` that names an incomplete checkpoint. ``checkpoint.keep_last`` holds remotely too (pinned ones stay).

When a checkpoint is due, its files are hard-linked into ``<ckpt-dir>/.mirror/`` (instant, and immune to the
local prune), and a worker thread uploads them. A failed upload stays at the head of the queue and is retried
with backoff (2 s doubling to 60 s); a newer checkpoint replaces an older one that has not started. A store
that is down or refuses the credentials never stops training: one warning and one alert open an episode, one
line (and one alert) closes it when the mirror has caught up.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget import ledger
from ..budget.ledger import LEDGER_FILE
from ..core import names as N
from ..core.log import Log
from . import checkpoint as ck
from . import run_owner
from .objstore import MISSING_KEY_CODES, Store, StoreError, scrub
from .upload_worker import UploadProcess

STAGING = ".mirror"
MLFLOW_DB = N.MLFLOW_DB
MLFLOW_FILES = "mlruns"  # a file:// MLflow store goes up file by file under this key
BACKOFF_S = (2.0, 4.0, 8.0, 16.0, 32.0, 60.0)
UPLOAD_PROCESS_MIN_BYTES = 1 << 20  # with upload_process: files this large go up from the child process


@dataclass
class _Job:
    kind: str  # "checkpoint", "file", "mlflow" (sqlite) or "mlflow_files" (a file:// store)
    name: str  # the step dir's name, the file's name, or the sqlite file's path
    staged: Path | None = None
    step: int = -1


@dataclass(frozen=True)
class MlflowStore:
    """Where the MLflow store lives on this disk: a sqlite file or a ``file://`` store's folder."""

    path: Path
    sqlite: bool


def mlflow_store(mlflow_uri: str | None, ckpt_dir: Path) -> MlflowStore | None:
    """The run's MLflow store on this disk (the default: ``<ckpt-dir>/mlflow.db``); None for a tracking server
    (it outlives the machine)."""
    if not mlflow_uri:
        return MlflowStore(ckpt_dir.resolve() / MLFLOW_DB, True)
    if mlflow_uri.startswith("sqlite:///"):
        return MlflowStore(Path(mlflow_uri[len("sqlite:///") :]), True)
    if mlflow_uri.startswith("file://"):
        return MlflowStore(Path(mlflow_uri[len("file://") :]), False)
    if "://" not in mlflow_uri:
        return MlflowStore(Path(mlflow_uri), False)
    return None


class Mirror:
    """Uploads for one checkpoint dir (rank 0's). ``checkpoint``, ``file`` and ``mlflow`` queue work and return at
    once; ``drain`` waits for the queue within a deadline; ``close`` ends the worker."""

    def __init__(
        self,
        store: Store,
        ckpt_dir: Path,
        keep_last: int,
        log: Log,
        alert: Callable[[str, str], Any] | None = None,
        sleep: Callable[[float], None] | None = None,
        upload_process: bool = False,
    ) -> None:
        self.store, self.dir, self.keep_last, self._log, self._alert = store, ckpt_dir, keep_last, log, alert
        self._cv = threading.Condition()
        self._queue: list[_Job] = []
        self._busy = False
        self._closed = False
        self.failing = 0  # failed attempts in the current episode (0: none)
        self.last_error: str | None = None
        self.remote_latest: str | None = None  # what the remote's ``latest`` names, as far as this process knows
        self.uploaded_bytes = 0
        self.upload_s = 0.0
        self._wait = sleep
        self._sent: dict[str, tuple[int, int]] = {}  # a file store's files as last uploaded (size, mtime)
        # who this run is (run_owner): read from the checkpoint dir; None until the mirror claims a prefix
        self.run_id: str | None = run_owner.local_id(ckpt_dir)
        self.resume = False  # a --resume-from-latest run: it may claim a prefix of ownerless steps
        self.refused: str | None = None  # the run that owns the prefix when it is not this one: nothing goes up
        self.refusal: str | None = None  # then why, as the launch would have said it (the run stops with it)
        self.remote_newest = -1  # the newest complete remote step as last listed (-1: none, unknown)
        self._checked_in = False  # owner checked, old multipart uploads aborted, remote_newest listed
        self._started_unix = time.time()
        self._said: set[str] = set()  # the once-only warnings given
        # large files go up from a niced child process (no GIL shared with training), small ones from here
        self._uploader = UploadProcess(store, log) if upload_process else None
        self._thread: threading.Thread | None = None
        shutil.rmtree(ckpt_dir / STAGING, ignore_errors=True)  # what a killed process left staged

    def start(self) -> Mirror:
        self._thread = threading.Thread(target=self._work, name="x1-mirror", daemon=True)
        self._thread.start()
        return self

    # -- what the run asks for (any thread) --
    def checkpoint(self, step_dir: Path) -> None:
        """Queue a complete step dir: its files are hard-linked into the staging dir now."""
        staged = self.dir / STAGING / step_dir.name
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for f in step_dir.iterdir():
            if f.is_file():
                try:
                    os.link(f, staged / f.name)
                except OSError:  # a file system without hard links
                    shutil.copy2(f, staged / f.name)
        step = int(ck.STEP_RE.match(step_dir.name).group(1))  # type: ignore[union-attr]
        with self._cv:
            started = self._queue[0] if self._busy and self._queue else None
            for old in [j for j in self._queue if j.kind == "checkpoint" and j.step < step and j is not started]:
                self._queue.remove(old)  # not started: the newer one replaces it
                if old.staged is not None:
                    shutil.rmtree(old.staged, ignore_errors=True)
                self._log(f"mirror: {old.name} was not uploaded yet; {step_dir.name} replaces it")
            self._queue.append(_Job("checkpoint", step_dir.name, staged, step))
            self._cv.notify_all()

    def file(self, name: str) -> None:
        """Queue a file of the checkpoint dir (read when its turn comes); one queued copy is enough."""
        self._add(_Job("file", name))

    def mlflow(self, store: MlflowStore) -> None:
        """Queue the MLflow store: a sqlite file as a consistent copy (sqlite's backup API) named as the default store;
        a ``file://`` store's folder file by file under ``mlruns/`` (the files changed since the last upload;
        the tracker has flushed before a checkpoint, so they hold every metric up to it)."""
        self._add(_Job("mlflow" if store.sqlite else "mlflow_files", str(store.path)))

    def _add(self, job: _Job) -> None:
        with self._cv:
            if not any(j.kind == job.kind and j.name == job.name for j in self._queue):
                self._queue.append(job)
                self._cv.notify_all()

    def pending(self) -> list[str]:
        with self._cv:
            return [{"mlflow": MLFLOW_DB, "mlflow_files": MLFLOW_FILES}.get(j.kind, j.name) for j in self._queue]

    def drain(self, timeout_s: float, failures: int = 1) -> bool:
        """Wait until everything queued is uploaded (True), ``timeout_s`` passes, or ``failures`` more attempts
        have failed since the call (0: never give up early): a store that is down does not hold an exit."""
        end = time.monotonic() + max(timeout_s, 0.0)
        failing_at_start = self.failing
        with self._cv:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0 or (failures and self.failing >= failing_at_start + failures):
                    return False
                self._cv.wait(min(left, 0.5))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._uploader is not None:
            self._uploader.close()  # an upload in flight ends now (its step dir is not named remotely yet)
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the worker --
    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job, self._busy = self._queue[0], True
            try:
                self._run(job)
            except (StoreError, OSError) as e:
                if self._closed:  # an upload that close() ended: not a store failure worth a warning
                    return
                self._failed(job, e)
                continue
            except Exception as e:  # anything else from the client: retried like a store failure, never fatal
                self._failed(job, StoreError("other", scrub(f"{type(e).__name__}: {e}")))
                continue
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
            with self._cv:
                if self._queue and self._queue[0] is job:
                    self._queue.pop(0)
                self._cv.notify_all()
            self._recovered()

    def _run(self, job: _Job) -> None:
        t0 = time.monotonic()
        if not self._checked_in:
            self._check_in()
        if self.refused is not None or self._behind(job):
            if job.staged is not None:
                shutil.rmtree(job.staged, ignore_errors=True)
            return
        if job.kind == "checkpoint":
            self._upload_checkpoint(job)
        elif job.kind == "mlflow":
            self._upload_mlflow(Path(job.name))
        elif job.kind == "mlflow_files":
            self._upload_mlflow_files(Path(job.name))
        elif job.name == LEDGER_FILE:
            self._put_ledger(self.dir / LEDGER_FILE)
        else:
            path = self.dir / job.name
            if path.is_file():
                self._put(path, job.name)
        self.upload_s += time.monotonic() - t0

    def _put(self, path: Path, rel: str) -> None:
        size = path.stat().st_size
        meta = {run_owner.META_KEY: self.run_id} if self.run_id else None  # whose object it is: prune reads it
        if not (
            self._uploader is not None and size >= UPLOAD_PROCESS_MIN_BYTES and self._uploader.put_file(path, rel, meta)
        ):
            self.store.put_file(path, rel, metadata=meta)
        self.uploaded_bytes += size

    def _put_ledger(self, path: Path) -> None:
        """The cost ledger never lowers the remote's spend: the remote copy is read (validated like a pull), the
        local one goes up with the money the remote counted more (``ledger.merge``), by a conditional write on
        the ETag read (or on its absence), so a writer that changed it meanwhile is read again, not overwritten.
        A remote copy that is not a ledger is replaced; a local one that is not is not uploaded."""
        if not path.is_file():
            return
        local, problem = ledger.parse_text(path.read_bytes(), str(path))
        if local is None:
            self._warn_once("bad-ledger", f"{problem}: it is not uploaded", alert=False)
            return
        meta = {run_owner.META_KEY: self.run_id} if self.run_id else None
        for _ in range(5):
            cur = self.store.get_tagged(LEDGER_FILE)
            remote = ledger.parse_text(cur[0], f"the remote {self.store.url}/{LEDGER_FILE}")[0] if cur else None
            blob = ledger.merge(local, remote) if remote is not None else local
            data = (json.dumps(blob, indent=1) + "\n").encode()
            try:
                self.store.put_bytes(
                    data, LEDGER_FILE, if_match=cur[1] if cur else None, if_none_match=cur is None, metadata=meta
                )
            except StoreError as e:  # another writer changed it between the read and the write: read it again
                if e.kind != "conflict" and e.detail.split(":")[0] not in MISSING_KEY_CODES:
                    raise
                continue
            self.uploaded_bytes += len(data)
            if ledger.spent(blob) > ledger.spent(local):
                self._warn_once(
                    "ledger-merged",
                    f"the remote {LEDGER_FILE} in {self.store.url} counted "
                    f"${ledger.spent(remote):.2f}, more than this run's ${ledger.spent(local):.2f}: "
                    "the larger spend stays in the remote's",
                    alert=False,
                )
            return
        raise StoreError("conflict", f"the remote {LEDGER_FILE} kept changing under this run's writes")

    # -- ownership: before anything is written, and before anything is deleted --
    def _check_in(self) -> None:
        """Once, before the first write (retried like an upload while the store is down, so a launch that could
        not reach it checks here): the prefix's owner is this run (claimed when it has none and holds no older
        run's checkpoints, or this is a resume: ``run_owner.settle``'s rule), the multipart uploads an earlier
        process left under the prefix are aborted, and the newest complete remote step is listed. Anything else is
        refused: nothing is written, and the run stops at its next step boundary (``MirrorRefused``)."""
        owner = run_owner.remote_id(self.store)
        if owner is None:
            legacy = run_owner.legacy_refusal(self.store, self.resume)
            if legacy is not None:
                self._refuse("an earlier run (no owner object)", legacy)
                return
            mine = self.run_id or run_owner.new_run_id()
            owner = run_owner.claim(self.store, mine)
            if owner == mine:
                self.run_id = mine
                self._log(f"mirror: {self.store.url} belongs to run {owner}")
        if owner != self.run_id:  # never adopted without proof (run_owner.identity)
            self._refuse(owner, run_owner.refusal(self.store, owner, self.run_id))
            return
        run_owner.keep_local(self.dir, self.run_id)
        for key in self.store.abort_uploads(self._started_unix, mine=self._mirrored_key):
            self._log(f"mirror: aborted an unfinished multipart upload of {key} (left by an earlier process)")
        self.remote_newest = self._newest_complete(self.store.list_objects("step_"))
        self._checked_in = True

    @staticmethod
    def _mirrored_key(rel: str) -> bool:
        """A key the mirror writes (a step dir's file, the MLflow store), not what other tools push under the same
        prefix (the cloud script's tokens, logs, the bundle), whose uploads may be under way right now."""
        return bool(ck.STEP_RE.match(rel.split("/")[0])) or rel == MLFLOW_DB or rel.startswith(MLFLOW_FILES + "/")

    def _refuse(self, owner: str, why: Exception) -> None:
        self.refusal, self.refused, self._checked_in = str(why), owner, True
        msg = (
            f"{why}. The mirror uploads nothing there and deletes nothing; the run stops at its next step "
            "boundary with a local checkpoint (exit 2)"
        )
        self._log(f"WARNING: {msg}")
        self._send(f"x1 checkpoint mirror refused ({self.store.url})", msg + ".")

    @staticmethod
    def _newest_complete(objects: dict[str, int]) -> int:
        steps = [
            int(m.group(1))
            for k in objects
            if k.endswith("/" + ck.DONE_FILE)
            for m in [ck.STEP_RE.match(k.split("/")[0])]
            if m
        ]
        return max(steps, default=-1)

    def _behind(self, job: _Job) -> bool:
        """A run that resumed from an older local checkpoint than the remote's newest (the store could not be
        reached at its launch) must not replace the newer remote state: its older checkpoints, ledger, exit status
        and MLflow copy are not uploaded (one loud warning) until it has a checkpoint newer than the remote's."""
        if job.kind == "checkpoint":
            return False  # decided on a fresh listing in _upload_checkpoint
        latest = ck.read_latest(self.dir)
        m = ck.STEP_RE.match(latest or "")
        here = int(m.group(1)) if m else -1
        if here >= self.remote_newest:
            return False
        self._warn_once(
            "behind",
            f"the remote {self.store.url} holds {ck.step_dir_name(self.remote_newest)}, newer "
            f"than this run's {latest or 'nothing'}: the ledger, the exit status and the MLflow "
            "copy are not uploaded over it until this run has a newer checkpoint (relaunch "
            "with --resume-from-latest to continue from the remote's)",
        )
        return True

    def _warn_once(self, key: str, msg: str, alert: bool = True) -> None:
        if key not in self._said:
            self._said.add(key)
            self._log(f"WARNING: mirror: {msg}")
            if alert:
                self._send(f"x1 checkpoint mirror: remote is newer ({self.store.url})", msg + ".")

    def _set_latest(self, name: str) -> bool:
        """Point the remote's ``latest`` at ``name`` with a conditional write on the ETag read (or on its absence),
        so of two writers exactly one wins; never at a step older than the one it names now. False: not moved."""
        for _ in range(5):
            cur = self.store.get_tagged(ck.LATEST)
            m = ck.STEP_RE.match(cur[0].decode(errors="replace").strip()) if cur else None
            if m and m.group(0) > name:
                self._warn_once(
                    f"latest-{m.group(0)}",
                    f"the remote latest names {m.group(0)}, newer than {name}: it is left as it is",
                )
                return False
            try:
                self.store.put_bytes(
                    f"{name}\n".encode(), ck.LATEST, if_match=cur[1] if cur else None, if_none_match=cur is None
                )
                return True
            except StoreError as e:  # another writer moved it between the read and the write: read it again
                if e.kind != "conflict" and e.detail.split(":")[0] not in MISSING_KEY_CODES:
                    raise
        raise StoreError("conflict", f"the remote {ck.LATEST} kept changing under this run's writes")

    def _upload_checkpoint(self, job: _Job) -> None:
        assert job.staged is not None
        if job.name != self.remote_latest:  # not uploaded by this process already (a retry after a failed prune)
            listing = self.store.list_objects("step_")
            self.remote_newest = self._newest_complete(listing)
            there = {k.split("/", 1)[1] for k in listing if k.startswith(job.name + "/")}
            if there and not self._wrote(job.name, there):  # the same step name, written by something else
                shutil.rmtree(job.staged, ignore_errors=True)
                return
            if job.step < self.remote_newest:  # an older local fallback: the newer remote step stays, untouched
                self._warn_once(
                    "older",
                    f"{job.name} is older than the remote's "
                    f"{ck.step_dir_name(self.remote_newest)} in {self.store.url}: it is not uploaded, "
                    "the remote latest stays and nothing newer is deleted (relaunch with "
                    "--resume-from-latest to continue from the remote's)",
                )
                shutil.rmtree(job.staged, ignore_errors=True)
                return
            files = sorted(f for f in job.staged.iterdir() if f.name != ck.DONE_FILE)
            self._unname(job.name)
            self.store.delete([f"{job.name}/{ck.DONE_FILE}"])  # a step written again is incomplete until its DONE
            for f in files:
                self._put(f, f"{job.name}/{f.name}")
            self._put(job.staged / ck.DONE_FILE, f"{job.name}/{ck.DONE_FILE}")
            self.remote_newest = max(self.remote_newest, job.step)
            if not self._set_latest(job.name):
                shutil.rmtree(job.staged, ignore_errors=True)
                return
            self.remote_latest = job.name
            self._log(
                f"mirror: {job.name} is in {self.store.url} ({sum(f.stat().st_size for f in files) / 1e6:,.1f} MB)"
            )
        try:
            self._prune(job.name)
        except StoreError as e:  # the checkpoint is up: a prune that fails is tried again after the next one
            self._log(f"warning: the mirror could not prune old checkpoints in {self.store.url} ({e.detail})")
        shutil.rmtree(job.staged, ignore_errors=True)

    def _unname(self, name: str) -> None:
        """Before a step already named by the remote's ``latest`` is written again, ``latest`` names another
        complete step (or nothing), so it never names one without its DONE."""
        cur = self.store.get_tagged(ck.LATEST)
        if cur is None or cur[0] != f"{name}\n".encode():
            return
        others = sorted(
            k.split("/")[0]
            for k in self.store.list_objects("step_")
            if k.endswith("/" + ck.DONE_FILE) and not k.startswith(name + "/")
        )
        if others:  # the newest one before it (the timeline this run continues), else any
            self.store.put_bytes(
                f"{([o for o in others if o < name] or others)[-1]}\n".encode(), ck.LATEST, if_match=cur[1]
            )  # a writer that moved it meanwhile wins: retried after a read
        else:
            self.store.delete([ck.LATEST])

    def _prune(self, newest: str) -> None:
        """``keep_last`` complete step dirs remotely (plus pinned ones and ``newest``); incomplete ones (uploads
        a killed machine left) go too. Only after a listing that succeeded, only step dirs this run wrote (their
        objects carry its id), and never a complete step newer than ``newest``. A PIN file added locally after
        a step went up is uploaded and holds remotely too."""
        objects = self.store.list_objects("step_")  # a StoreError here: nothing is deleted
        by_step: dict[str, set[str]] = {}
        for rel in objects:
            step_name, _, name = rel.partition("/")
            if ck.STEP_RE.match(step_name):
                by_step.setdefault(step_name, set()).add(name)
        for step_name, names in by_step.items():
            pin = self.dir / step_name / ck.PIN_FILE
            if ck.PIN_FILE not in names and pin.is_file():
                self._put(pin, f"{step_name}/{ck.PIN_FILE}")
                names.add(ck.PIN_FILE)
        pinned = {s for s, n in by_step.items() if ck.PIN_FILE in n}
        complete = sorted(s for s, names in by_step.items() if ck.DONE_FILE in names and s <= newest)
        keep = set(complete[-self.keep_last :]) | {newest} | pinned
        keep |= {s for s, names in by_step.items() if ck.DONE_FILE in names and s > newest}  # never a newer one
        doomed = [s for s in by_step if s not in keep and self._wrote(s, by_step[s])]
        if doomed:
            self.store.delete([f"{s}/{n}" for s in sorted(doomed) for n in sorted(by_step[s])])

    def _wrote(self, step_name: str, names: set[str]) -> bool:
        """Whether this run wrote the step dir: its ``DONE`` (else any of its files) carries this run's id. One
        that did not is said once and never touched (neither deleted nor written over)."""
        if f"foreign-{step_name}" in self._said:
            return False
        probe = ck.DONE_FILE if ck.DONE_FILE in names else sorted(names)[0]
        found = self.store.head(f"{step_name}/{probe}")
        if found is not None and self.run_id and found[1].get(run_owner.META_KEY) == self.run_id:
            return True
        if found is not None:
            self._warn_once(
                f"foreign-{step_name}",
                f"{step_name} in {self.store.url} was not written by this run "
                f"({run_owner.META_KEY} {found[1].get(run_owner.META_KEY) or 'absent'}): it is kept, "
                "never deleted nor written over",
                alert=False,
            )
        return False

    def _upload_mlflow(self, db: Path) -> None:
        if not db.is_file():
            return
        copy = self.dir / STAGING / f"{MLFLOW_DB}.backup"
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.unlink(missing_ok=True)
        try:
            src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
            dst = sqlite3.connect(copy)
            try:
                src.backup(dst)
            finally:
                dst.close()
                src.close()
        except sqlite3.Error as e:
            raise OSError(f"the MLflow store {db} could not be copied ({e})") from None
        self._put(copy, MLFLOW_DB)
        copy.unlink(missing_ok=True)

    def _upload_mlflow_files(self, root: Path) -> None:
        if not root.is_dir():
            return
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            st = f.stat()
            rel = f.relative_to(root).as_posix()
            if self._sent.get(rel) != (st.st_size, st.st_mtime_ns):
                self._put(f, f"{MLFLOW_FILES}/{rel}")
                self._sent[rel] = (st.st_size, st.st_mtime_ns)

    # -- episodes --
    def _failed(self, job: _Job, e: BaseException) -> None:
        what = e.detail if isinstance(e, StoreError) else f"{type(e).__name__}: {e}"
        if isinstance(e, FileNotFoundError) and job.kind != "checkpoint":
            with self._cv:  # a file that is gone has nothing to upload
                if self._queue and self._queue[0] is job:
                    self._queue.pop(0)
            return
        self.failing += 1
        self.last_error = what
        if self.failing == 1:
            msg = (
                f"the mirror to {self.store.url} failed ({what}); local checkpoints go on, the upload of "
                f"{job.name} is retried with backoff and the mirror catches up when the store answers"
            )
            self._log(f"WARNING: {msg}")
            self._send(
                f"x1 checkpoint mirror failing ({self.store.url})", msg + ". No further alert until it recovers."
            )
        delay = BACKOFF_S[min(self.failing - 1, len(BACKOFF_S) - 1)]
        if self._wait is not None:
            self._wait(delay)
            return
        with self._cv:
            self._cv.wait_for(lambda: self._closed, timeout=delay)

    def _recovered(self) -> None:
        if not self.failing:
            return
        with self._cv:
            idle = not self._queue
        if not idle:
            return
        failed, self.failing = self.failing, 0
        msg = f"the mirror to {self.store.url} has caught up after {failed} failed attempt(s)"
        self._log(f"mirror: {msg} (remote latest {self.remote_latest or 'unchanged'})")
        self._send(f"x1 checkpoint mirror recovered ({self.store.url})", msg + ".")

    def _send(self, subject: str, body: str) -> None:
        if self._alert is None:
            return
        try:
            self._alert(subject, body)
        except Exception as e:  # an alert must not stop the mirror
            self._log(f"warning: a mirror alert could not be sent ({e})")
