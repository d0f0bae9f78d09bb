"""Who owns a ``--ckpt-remote`` prefix: the run identity that keeps one run from deleting or overwriting another's
checkpoints.

A run's id is made once, by its first launch, and kept in ``<ckpt-dir>/x1-run.json``; the prefix's owner object
``PREFIX/x1-run.json`` holds the id of the run that first wrote there, created with a conditional write
(``If-None-Match: *``) so two runs that start together cannot both become its owner. Relaunches and resumes of
the same run keep the id (the checkpoint dir holds it; a resume on an empty disk proves it with ``$X1_RUN_ID``:
nothing adopts an owner's id without that proof). Every object
the mirror writes carries the id as user metadata (``x1-run``), and the mirror deletes only objects that carry
its own (``ckpt/mirror.py``).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from ..core.errors import X1Error
from ..core.fileio import write_text_atomic
from ..core.log import Log
from . import checkpoint as ck
from .objstore import Store, StoreError
from .remote_dir import RUN_FILE, RUN_ID_ENV, given_run_id, run_id_in, run_id_of_dir

OWNER = RUN_FILE  # "x1-run.json": in the checkpoint dir and under the prefix
FORMAT = "x1-run/1"
META_KEY = "x1-run"  # the user metadata every mirrored object carries: the id of the run that wrote it


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def _blob(run_id: str) -> str:
    return json.dumps({"format": FORMAT, "run_id": run_id, "created_unix": round(time.time(), 3)}) + "\n"


def local_id(ckpt_dir: Path) -> str | None:
    """The run id this checkpoint dir belongs to (None: none recorded yet)."""
    return run_id_of_dir(ckpt_dir)


def keep_local(ckpt_dir: Path, run_id: str) -> None:
    if local_id(ckpt_dir) != run_id:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ckpt_dir / OWNER, _blob(run_id))


def remote_id(store: Store) -> str | None:
    """The id in the prefix's owner object (None: no owner yet); a StoreError when it cannot be read. An owner
    object that cannot be parsed is an owner all the same (``unreadable``): never overwritten."""
    data = store.get_bytes(OWNER)
    if data is None:
        return None
    return run_id_in(data) or "unreadable"


def claim(store: Store, run_id: str) -> str:
    """Make ``run_id`` the prefix's owner unless it has one: the id that owns it after the call (``run_id``
    when this call won). A conditional create, so of two runs claiming at once exactly one wins."""
    try:
        store.put_bytes(_blob(run_id).encode(), OWNER, if_none_match=True)
        return run_id
    except StoreError as e:
        if e.kind != "conflict":
            raise
    return remote_id(store) or "unreadable"


def _legacy_steps(store: Store) -> list[str]:
    """Complete checkpoints under the prefix (for a prefix without an owner: written before run ids existed)."""
    return sorted(k.split("/")[0] for k in store.list_objects("step_") if k.endswith("/" + ck.DONE_FILE))


def refusal(store: Store, owner: str, mine: str | None) -> X1Error:
    this = (
        f"; this --ckpt-dir belongs to run {mine}"
        if mine
        else f"; this run gives no proof that it is that run (no {OWNER} in its --ckpt-dir, no {RUN_ID_ENV})"
    )
    return X1Error(
        f"--ckpt-remote {store.url} belongs to run {owner} (its {OWNER}){this}: a run never deletes or "
        f"overwrites another run's checkpoints. Fix: give this run a prefix of its own (another "
        f"--ckpt-remote), or continue run {owner} with --resume-from-latest and {RUN_ID_ENV}={owner} "
        "in the environment (or the --ckpt-dir that run wrote)"
    )


def legacy_refusal(store: Store, resume: bool) -> X1Error | None:
    """For a prefix without an owner: the exit-2 error when it holds checkpoints (written before run ids
    existed) that a fresh run would write over; None when it may be claimed."""
    held = [] if resume else _legacy_steps(store)
    if not held:
        return None
    return X1Error(
        f"--ckpt-remote {store.url} already holds checkpoints ({held[-1]}) but no {OWNER}; pass "
        "--resume-from-latest to continue that run, or choose another prefix"
    )


def identity(ckpt_dir: Path) -> str | None:
    """The proof of who this run is: the id its checkpoint dir records, else ``$X1_RUN_ID``; an X1Error (exit 2)
    when both are there and differ."""
    mine, given = local_id(ckpt_dir), given_run_id()
    if mine and given and mine != given:
        raise X1Error(
            f"{RUN_ID_ENV}={given} but {ckpt_dir / OWNER} says this checkpoint dir belongs to run {mine}: "
            f"unset {RUN_ID_ENV} (or set it to {mine}) to continue that run, or use another --ckpt-dir"
        )
    return mine or given


def settle(store: Store, ckpt_dir: Path, resume: bool, log: Log) -> str:
    """At launch, with the store answering: the run id this process mirrors under, the prefix claimed or adopted;
    an X1Error (exit 2) for a prefix that another run owns, or one with checkpoints and no owner that a fresh run
    would write over. This run is the id its checkpoint dir records, else ``$X1_RUN_ID`` (a resume on a new
    machine proves with it that it is the owner's run), else a new one; a prefix owned by any other id is refused."""
    mine, owner = identity(ckpt_dir), remote_id(store)
    if owner is None:
        legacy = legacy_refusal(store, resume)
        if legacy is not None:
            raise legacy
        run_id = mine or new_run_id()
        owner = claim(store, run_id)
        if owner == run_id:
            keep_local(ckpt_dir, run_id)
            log(f"remote: {store.url} belongs to run {run_id} ({OWNER} created)")
            return run_id
    if owner == mine:
        if local_id(ckpt_dir) is None:
            keep_local(ckpt_dir, owner)
            log(
                f"remote: resuming run {owner}, the owner of {store.url} ({RUN_ID_ENV}): this checkpoint dir "
                "adopts its id"
            )
        return owner
    raise refusal(store, owner, mine)


def offline(ckpt_dir: Path, resume: bool) -> str | None:
    """At launch, with the store not answering: the id kept locally (else ``$X1_RUN_ID``), a new one for a fresh
    run, or None for a resume with neither (the mirror claims a prefix with no owner, and refuses an owned one,
    when the store answers)."""
    mine = identity(ckpt_dir)
    if mine is None and not resume:
        mine = new_run_id()
    if mine is not None:
        keep_local(ckpt_dir, mine)
    return mine


def at_launch(store: Store, ckpt_dir: Path, resume: bool, reachable: bool, log: Log) -> str | None:
    """The launch's verdict (rank 0, before any pull): :func:`settle` when the store answered, else
    :func:`offline`; the mirror checks the owner again before its first write either way."""
    if reachable:
        try:
            return settle(store, ckpt_dir, resume, log)
        except StoreError as e:
            log(
                f"WARNING: the owner of {store.url} ({OWNER}) could not be read ({e.detail}); the mirror checks it "
                "before its first upload and writes nothing under another run's prefix"
            )
    return offline(ckpt_dir, resume)
