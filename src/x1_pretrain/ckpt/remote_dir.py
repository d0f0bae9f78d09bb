"""A whole directory to and from the object store, complete or not at all (``python -m x1_pretrain.remote``).

What it is for: the tokens (hours of download and tokenizing) and the logs of a cloud run, which a new machine
after a preemption should find in the bucket next to the checkpoints instead of making them again.

The rule that keeps a reader safe is the checkpoints' rule: a manifest, ``x1-dir.json``, listing every file with
its size and sha256, goes up last and is deleted first. A push cut short leaves no manifest, and a pull takes
only what a manifest lists, checks every hash, and renames the folder into place only when all of it is there.
Files whose name starts with a dot (an x1 file being written, a pull in progress) are never pushed. A file
that may still grow (a log) is pushed from a snapshot, so the hash in the manifest is the hash of the bytes
that went up; each object carries its sha256 as metadata, so a push sends again exactly what differs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from ..core.errors import X1Error
from ..core.fileio import inside, pid_alive, sha256_file
from ..core.log import Log
from .objstore import Store, StoreError

MANIFEST = "x1-dir.json"


class PullFailed(Exception):
    """The remote copy could not be brought down whole (a store failure or a file that does not match its hash);
    nothing was put in place. Worth another try: exit 1."""


SNAPSHOT_MAX_BYTES = 64 << 20  # files up to this size are pushed from a copy (a log may grow meanwhile)
_PULL_RE = re.compile(r"^\.(?P<name>.+)\.pull-(?P<pid>\d+)$")


def _files(local: Path, links: list[str] | None = None) -> list[str]:
    """Every regular file under ``local`` (relative, posix), hidden names left out. A symlink (to a file or a
    folder) is never followed: it could take a file from outside the folder into the bucket; each one is added
    to ``links``."""
    out = []
    for root, dirs, names in os.walk(local):  # os.walk does not descend into symlinked folders
        for d in dirs:
            if links is not None and not d.startswith(".") and (Path(root) / d).is_symlink():
                links.append((Path(root) / d).relative_to(local).as_posix())
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (Path(root) / d).is_symlink())
        for name in sorted(n for n in names if not n.startswith(".")):
            path = Path(root) / name
            rel = path.relative_to(local).as_posix()
            if path.is_symlink():
                if links is not None:
                    links.append(rel)
            elif rel != MANIFEST and path.is_file():
                out.append(rel)
    return out


def listing(local: Path) -> dict[str, dict[str, object]]:
    """{relative path: {"bytes", "sha256"}} of every file under ``local``, hidden names left out."""
    return {rel: {"bytes": (local / rel).stat().st_size, "sha256": sha256_file(local / rel)} for rel in _files(local)}


def remote_manifest(store: Store) -> dict | None:
    raw = store.get_bytes(MANIFEST)
    if raw is None:
        return None
    try:
        manifest = json.loads(raw)
        files = manifest["files"]
        for meta in files.values():
            int(meta["bytes"]), str(meta["sha256"])
        return manifest
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise X1Error(
            f"{store.url}/{MANIFEST} cannot be read ({type(e).__name__}: {e}): push the folder again"
        ) from None


Entry = dict[str, object]  # a manifest's {"bytes", "sha256"} of one file


def _send(store: Store, local: Path, rel: str, snapshots: Path, remote_size: int | None) -> tuple[Entry, bool]:
    """Upload one file unless the remote object (``remote_size`` from the listing) already holds these bytes;
    returns its manifest entry and whether it was sent."""
    path = local / rel
    size = path.stat().st_size
    if size <= SNAPSHOT_MAX_BYTES:
        copy = snapshots / "file"
        shutil.copyfile(path, copy)
        path, size = copy, copy.stat().st_size
    before = path.stat().st_mtime_ns
    meta: dict[str, object] = {"bytes": size, "sha256": sha256_file(path)}
    there = store.head(rel) if remote_size == size else None  # only a same-size object can hold these bytes
    if there is not None and there[0] == size and there[1].get("sha256") == meta["sha256"]:
        return meta, False
    store.put_file(path, rel, metadata={"sha256": str(meta["sha256"])})
    if path.stat().st_mtime_ns != before or path.stat().st_size != size:
        raise X1Error(
            f"{local / rel} changed while it was pushed (more than {SNAPSHOT_MAX_BYTES >> 20} MB: not "
            "snapshotted); push it once nothing writes to it"
        )
    return meta, True


def push(store: Store, local: Path, log: Log, if_absent: bool = False) -> tuple[int, int]:
    """Upload ``local`` under the store's prefix, files first and the manifest last; objects that already hold
    the same bytes (their sha256 metadata) are not sent again; files the previous manifest listed that
    ``local`` no longer has are deleted after the new manifest. ``if_absent``: leave a complete copy that is
    already there alone. Returns (files sent, bytes sent)."""
    if not local.is_dir():
        raise X1Error(f"{local}: no such folder to push (give the folder the files are in)")
    links: list[str] = []
    rels = _files(local, links)
    if links:
        log(
            f"warning: {local}: {len(links)} symlink(s) not pushed, never followed ({', '.join(links[:5])}): copy "
            "the file itself into the folder if it belongs there"
        )
    if not rels:
        raise X1Error(f"{local}: the folder holds no files to push")
    remote = store.list_objects()
    if "latest" in remote or any(k.startswith("step_") for k in remote):
        raise X1Error(
            f"{store.url} holds a checkpoint mirror (--ckpt-remote): push under a prefix of its own, "
            f"e.g. {store.url}/data/tokenized"
        )
    try:
        before = remote_manifest(store)
    except X1Error:
        before = None
    if if_absent and before is not None:
        log(f"{store.url} already holds a complete copy (pushed {before.get('pushed_utc', '?')}): left as it is")
        return 0, 0
    store.delete([MANIFEST])  # from here until the new manifest the remote copy is not complete
    files: dict[str, dict[str, object]] = {}
    sent = nbytes = 0
    snapshots = local / f".x1-push-{os.getpid()}"
    snapshots.mkdir(exist_ok=True)
    try:
        for rel in rels:
            files[rel], was_sent = _send(store, local, rel, snapshots, remote.get(rel))
            if was_sent:
                sent, nbytes = sent + 1, nbytes + int(files[rel]["bytes"])  # type: ignore[call-overload]
    finally:
        shutil.rmtree(snapshots, ignore_errors=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    store.put_bytes(json.dumps({"files": files, "pushed_utc": stamp}, indent=1).encode(), MANIFEST)
    # only what the previous manifest listed is ours to delete: nothing else under the prefix is touched
    stale = [k for k in (before or {"files": {}})["files"] if k not in files and k in remote]
    if stale:
        store.delete(stale)
    log(
        f"{local} -> {store.url}: {len(files)} files, {sent} sent ({nbytes / 1e6:,.1f} MB), "
        f"{len(files) - sent} already there" + (f", {len(stale)} old ones deleted" if stale else "")
    )
    return sent, nbytes


def verify(store: Store, local: Path) -> list[str]:
    """What the remote copy of ``local`` lacks: read its manifest back, compare it with the local files (size
    and sha256), then head every object (its size and its sha256 metadata). An empty list: the remote holds
    every local file, byte for byte. Store failures are reported, not raised."""
    try:
        manifest = remote_manifest(store)
    except (X1Error, StoreError) as e:
        return [f"{store.url}/{MANIFEST}: unreadable ({e.detail if isinstance(e, StoreError) else e})"]
    if manifest is None:
        return [f"{store.url}/{MANIFEST}: absent (the push did not complete)"]
    files: dict = manifest["files"]
    missing = []
    for rel, meta in listing(local).items():
        there = files.get(rel)
        if there is None or int(there["bytes"]) != meta["bytes"] or there["sha256"] != meta["sha256"]:
            missing.append(f"{store.url}/{rel}: not in the remote manifest as it is here (size or sha256)")
            continue
        try:
            head = store.head(rel)
        except StoreError as e:
            missing.append(f"{store.url}/{rel}: cannot be read ({e.kind}: {e.detail})")
            continue
        if head is None or head[0] != meta["bytes"] or head[1].get("sha256") != meta["sha256"]:
            missing.append(f"{store.url}/{rel}: " + ("absent" if head is None else "differs (size or sha256)"))
    return missing


def _clear_old_pulls(parent: Path, name: str) -> None:
    """Hidden folders a killed pull of ``name`` left (its process is gone)."""
    for p in parent.glob(f".{name}.pull-*"):
        m = _PULL_RE.match(p.name)
        if m and m.group("name") == name and not pid_alive(int(m.group("pid"))):
            shutil.rmtree(p, ignore_errors=True)


def pull(store: Store, local: Path, log: Log) -> str:
    """Bring the remote copy down into ``local`` (absent or an empty folder), every hash checked, renamed into
    place whole. Returns "pulled", "present" (``local`` already holds exactly that) or "absent" (no complete
    remote copy)."""
    manifest = remote_manifest(store)
    if manifest is None:
        return "absent"
    files: dict = manifest["files"]
    local = local.resolve()
    tmp = local.parent / f".{local.name}.pull-{os.getpid()}"
    where = f"{store.url}/{MANIFEST} names"
    dests = {rel: inside(tmp, rel, where, "it was not written by x1; push the folder again") for rel in files}
    if local.exists() and (not local.is_dir() or any(local.iterdir())):
        if local.is_dir() and listing(local) == {
            r: {"bytes": m["bytes"], "sha256": m["sha256"]} for r, m in files.items()
        }:
            return "present"
        raise X1Error(
            f"{local}: not an empty folder, and it differs from {store.url} (pushed "
            f"{manifest.get('pushed_utc', '?')}); pull into an empty folder or move this one away"
        )
    local.parent.mkdir(parents=True, exist_ok=True)
    _clear_old_pulls(local.parent, local.name)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, meta in files.items():
            dest = dests[rel]  # checked above, before anything was written
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(rel, dest)
            if dest.stat().st_size != int(meta["bytes"]) or sha256_file(dest) != meta["sha256"]:
                raise PullFailed(
                    f"{store.url}/{rel} does not match its manifest (size or sha256): push the folder "
                    "again from a machine that has it"
                )
        if local.exists():
            local.rmdir()  # still empty: anything written into it meanwhile makes this fail, and stays
        os.replace(tmp, local)
    except StoreError as e:
        raise PullFailed(f"{store.url}: {e.kind}: {e.detail}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(int(m["bytes"]) for m in files.values())
    log(f"{store.url} -> {local}: {len(files)} files ({total / 1e6:,.1f} MB), every sha256 checked")
    return "pulled"


# -- whose prefix a push writes into: a run never overwrites what another run wrote (ckpt/run_owner.py) --
RUN_FILE = "x1-run.json"  # a run's id: in its checkpoint dir, and at the root of the --ckpt-remote prefix it owns
RUN_ID_ENV = "X1_RUN_ID"  # an explicit run id: a fresh run takes it, a resume proves with it which run it is
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def run_id_in(data: bytes | str | None) -> str | None:
    """The ``run_id`` of an ``x1-run.json`` blob (None: absent or not one)."""
    try:
        blob = json.loads(data) if data else None
    except ValueError:
        return None
    run_id = blob.get("run_id") if isinstance(blob, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def run_id_of_dir(ckpt_dir: Path) -> str | None:
    """The run id a checkpoint dir records (``<ckpt-dir>/x1-run.json``; None: none yet)."""
    try:
        return run_id_in((ckpt_dir / RUN_FILE).read_text())
    except OSError:
        return None


def given_run_id() -> str | None:
    """``$X1_RUN_ID`` (None when unset or empty); an X1Error (exit 2) for one that is not a plain id."""
    value = os.environ.get(RUN_ID_ENV, "").strip()
    if not value:
        return None
    if not _RUN_ID_RE.match(value):
        raise X1Error(
            f"{RUN_ID_ENV}={value[:120]!r} is not a run id: 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. the owner's id that an x1-run.json names)"
        )
    return value


def run_id_for(run_dir: Path | None) -> str | None:
    """The run id a command acts as: ``run_dir``'s ``x1-run.json``, else ``$X1_RUN_ID`` (None: neither)."""
    return (run_id_of_dir(run_dir) if run_dir is not None else None) or given_run_id()


def nearest_owner(store: Store) -> tuple[str, str] | None:
    """The nearest ``x1-run.json`` at or above the store's prefix: (the owned prefix's URL, its run id), the id
    ``unreadable`` for one that cannot be parsed; None when no prefix above is owned. A StoreError when one
    cannot be read."""
    parts = store.url.prefix.split("/") if store.url.prefix else []
    for n in range(len(parts), -1, -1):
        above = Store(type(store.url)(store.url.bucket, "/".join(parts[:n])), *store.timeouts)
        data = above.get_bytes(RUN_FILE)
        if data is not None:
            return str(above.url), run_id_in(data) or "unreadable"
    return None


def check_owner(store: Store, run_id: str | None, how: str) -> None:
    """Before a push: an X1Error (exit 2) when the prefix it writes into belongs to another run than ``run_id``
    (or to any run, when ``run_id`` is None); ``how`` says how this command is told its run id."""
    found = nearest_owner(store)
    if found is None or (run_id is not None and found[1] == run_id):
        return
    prefix, owner = found
    mine = f"this run is {run_id}" if run_id else f"this push has no run id ({how})"
    raise X1Error(
        f"{store.url} is inside {prefix}, which belongs to run {owner} (its {RUN_FILE}); {mine}: a run "
        f"never deletes or overwrites another run's files, so nothing was written. Fix: push under a "
        f"prefix of your own, or, if this is run {owner}, say so ({how})"
    )
