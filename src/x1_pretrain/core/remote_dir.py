"""A whole directory to and from the object store, complete or not at all (``python -m x1_pretrain.remote``).

What it is for: the tokens (hours of download and tokenizing) and the logs of a cloud run, which a new machine
after a preemption should find in the bucket next to the checkpoints instead of making them again.

The rule that keeps a reader safe is the checkpoints' rule: a manifest, ``x1-dir.json``, listing every file with
its size and sha256, goes up last and is deleted first. A push cut short leaves no manifest, and a pull takes
only what a manifest lists, checks every hash, and renames the folder into place only when all of it is there.
Files whose name starts with a dot (an x1 file being written, a pull in progress) are never pushed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .errors import X1Error
from .objstore import Store, StoreError

MANIFEST = "x1-dir.json"
Log = Callable[[str], None]


class PullFailed(Exception):
    """The remote copy could not be brought down whole (a store failure or a file that does not match its hash);
    nothing was put in place. Worth another try: exit 1."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def listing(local: Path) -> dict[str, dict[str, object]]:
    """{relative path: {"bytes", "sha256"}} of every file under ``local``, hidden names left out."""
    files: dict[str, dict[str, object]] = {}
    for root, dirs, names in os.walk(local):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".") and n != MANIFEST):
            path = Path(root) / name
            if path.is_file():
                files[path.relative_to(local).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    return files


def remote_manifest(store: Store) -> dict | None:
    raw = store.get_bytes(MANIFEST)
    if raw is None:
        return None
    try:
        manifest = json.loads(raw)
        if not isinstance(manifest.get("files"), dict):
            raise ValueError("no 'files'")
        return manifest
    except (ValueError, AttributeError) as e:
        raise PullFailed(f"{store.url}/{MANIFEST} cannot be read ({e}): push the folder again") from None


def push(store: Store, local: Path, log: Log) -> tuple[int, int]:
    """Upload ``local`` under the store's prefix, files first and the manifest last; files the remote already
    holds with the same hash are not sent again, files the previous manifest listed that ``local`` no longer has
    are deleted after the new manifest. Returns (files sent, bytes sent)."""
    if not local.is_dir():
        raise X1Error(f"{local}: no such folder to push (give the folder the files are in)")
    files = listing(local)
    if not files:
        raise X1Error(f"{local}: the folder holds no files to push")
    try:
        before = remote_manifest(store)
    except PullFailed:
        before = None
    remote = store.list_objects()
    if "latest" in remote or any(k.startswith("step_") for k in remote):
        raise X1Error(f"{store.url} holds a checkpoint mirror (--ckpt-remote): push under a prefix of its own, "
                      f"e.g. {store.url}/data/tokenized")
    store.delete([MANIFEST])   # from here until the new manifest the remote copy is not complete
    sent = nbytes = 0
    for rel, meta in files.items():
        same = before is not None and before["files"].get(rel) == meta and remote.get(rel) == meta["bytes"]
        if not same:
            store.put_file(local / rel, rel)
            sent, nbytes = sent + 1, nbytes + int(meta["bytes"])   # type: ignore[call-overload]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    store.put_bytes(json.dumps({"files": files, "pushed_utc": stamp}, indent=1).encode(), MANIFEST)
    # only what the previous manifest listed is ours to delete: nothing else under the prefix is touched
    stale = [k for k in (before or {"files": {}})["files"] if k not in files and k in remote]
    if stale:
        store.delete(stale)
    log(f"{local} -> {store.url}: {len(files)} files, {sent} sent ({nbytes / 1e6:,.1f} MB), "
        f"{len(files) - sent} already there" + (f", {len(stale)} old ones deleted" if stale else ""))
    return sent, nbytes


def _matches(local: Path, files: dict) -> bool:
    return listing(local) == files


def pull(store: Store, local: Path, log: Log) -> str:
    """Bring the remote copy down into ``local`` (absent or empty), every hash checked, renamed into place whole.
    Returns "pulled", "present" (``local`` already holds exactly that) or "absent" (no complete remote copy)."""
    manifest = remote_manifest(store)
    if manifest is None:
        return "absent"
    files: dict = manifest["files"]
    if local.exists() and any(not p.name.startswith(".") for p in local.iterdir()):
        if _matches(local, files):
            return "present"
        raise X1Error(f"{local}: the folder is not empty and differs from {store.url} (pushed "
                      f"{manifest.get('pushed_utc', '?')}); pull into an empty folder or move this one away")
    tmp = local.parent / f".{local.name}.pull-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, meta in files.items():
            dest = tmp / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.get_file(rel, dest)
            if dest.stat().st_size != meta["bytes"] or sha256_of(dest) != meta["sha256"]:
                raise PullFailed(f"{store.url}/{rel} does not match its manifest (size or sha256): push the folder "
                                 "again from a machine that has it")
        if local.exists():
            shutil.rmtree(local)    # empty, or only hidden leftovers (checked above)
        os.replace(tmp, local)
    except StoreError as e:
        raise PullFailed(f"{store.url}: {e.kind}: {e.detail}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(int(m["bytes"]) for m in files.values())
    log(f"{store.url} -> {local}: {len(files)} files ({total / 1e6:,.1f} MB), every sha256 checked")
    return "pulled"
