"""A folder to and from an S3-compatible bucket, whole or not at all: the tokens and the logs of a cloud run, so
that a new machine after a preemption finds them next to the checkpoints (``--ckpt-remote``) instead of
downloading and tokenizing again.

  python -m x1_pretrain.remote push /workspace/data/tokenized s3://x1-runs/lab00/data/tokenized
  python -m x1_pretrain.remote pull s3://x1-runs/lab00/data/tokenized /workspace/data/tokenized --if-present

``push`` uploads every file, then ``x1-dir.json`` (each file's size and sha256) last, so a push cut short is never
taken for a complete copy; files already there with the same hash are not sent again; ``--verify`` then reads the
manifest back and heads every object, and exits 1 unless each matches the local file. ``pull`` downloads what the
manifest lists into a hidden folder beside the destination, checks every hash, and renames it into place. The
endpoint and keys come from the standard AWS variables, as for --ckpt-remote (docs/cloud-runbook.md).

Exit codes: 0 done (``pull --if-present``: also when the bucket holds no complete copy); 1 the store could not be
reached, a file did not match its hash, or a local disk error (worth another try); 2 bad usage: a malformed URL,
refused credentials, a missing bucket, a destination that holds other files, a manifest x1 did not write, nothing
to pull without --if-present, a push into a prefix another run owns (below).

A push never writes over another run's files: when the nearest ``x1-run.json`` at or above the URL (the owner
object a trainer's ``--ckpt-remote`` prefix holds) names a run, the push goes ahead only as that run, its id read
from ``--run-dir CKPT_DIR`` (``CKPT_DIR/x1-run.json``) or ``$X1_RUN_ID``; otherwise exit 2 and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .ckpt.objstore import CREDENTIALS_FIX, RemoteURL, Store, StoreError
from .ckpt.remote_dir import RUN_ID_ENV, PullFailed, check_owner, pull, push, run_id_for, verify
from .core.cli import guarded
from .core.contract import EXIT_UNEXPECTED
from .core.errors import X1Error
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.remote", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("push", help="upload a folder, its manifest last")
    up.add_argument("local", type=Path, help="the folder to upload")
    up.add_argument("url", help="s3://BUCKET/PREFIX to upload it under")
    up.add_argument(
        "--if-absent",
        action="store_true",
        help="leave a complete copy already there alone (tokens a run was trained on are never replaced)",
    )
    up.add_argument(
        "--verify",
        action="store_true",
        help="then read the manifest back and head every object (size and sha256 against the local "
        "files); exit 1 naming what differs. For a folder nothing writes to (a run bundle)",
    )
    up.add_argument(
        "--run-dir",
        type=Path,
        metavar="CKPT_DIR",
        help="the run this push belongs to: the run id in CKPT_DIR/x1-run.json (else $X1_RUN_ID). "
        "Inside a prefix a run owns (the nearest x1-run.json at or above URL) a push writes only "
        "as that run: another run's id, or none, is exit 2 and nothing is written",
    )
    down = sub.add_parser("pull", help="download a complete copy into an absent or empty folder")
    down.add_argument("url", help="s3://BUCKET/PREFIX a push wrote")
    down.add_argument("local", type=Path, help="the folder to create (absent or empty)")
    down.add_argument(
        "--if-present",
        action="store_true",
        help="exit 0 when the bucket holds no complete copy (a first run) instead of 2",
    )
    return p


def _store_failure(url: RemoteURL, e: StoreError) -> int:
    if e.kind == "auth":
        raise X1Error(f"{url}: the store refused the credentials ({e.detail}); {CREDENTIALS_FIX}")
    if e.kind == "bucket" or "NoSuchBucket" in e.detail:
        raise X1Error(f"{url}: no bucket {url.bucket!r} ({e.detail}); create it first or fix the name")
    print(f"error: {url}: {e.kind}: {e.detail} (try again when the store answers)", file=sys.stderr)
    return EXIT_UNEXPECTED


def _verified(store: Store, local: Path) -> int:
    missing = verify(store, local)
    for line in missing:
        print(f"error: {line}", file=sys.stderr)
    if missing:
        print(f"error: {store.url} does not hold all of {local} ({len(missing)} file(s)): push again", file=sys.stderr)
        return EXIT_UNEXPECTED
    print(f"[remote] {store.url}: every file of {local} read back, sizes and sha256 match", flush=True)
    return 0


RUN_HOW = f"--run-dir CKPT_DIR of that run, or {RUN_ID_ENV}=ID"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)

    def body() -> int:
        url = RemoteURL.parse(args.url, what=f"remote {args.cmd}")
        store = Store(url)
        try:
            if args.cmd == "push":
                check_owner(store, run_id_for(args.run_dir), RUN_HOW)
                push(store, args.local, lambda s: print(f"[remote] {s}", flush=True), if_absent=args.if_absent)
                return _verified(store, args.local) if args.verify else 0
            got = pull(store, args.local, lambda s: print(f"[remote] {s}", flush=True))
        except StoreError as e:
            return _store_failure(url, e)
        except PullFailed as e:
            print(f"error: {e} (nothing was put in {args.local})", file=sys.stderr)
            return EXIT_UNEXPECTED
        if got == "absent":
            if args.if_present:
                print(f"[remote] {url} holds no complete copy (no {url}/x1-dir.json): nothing to pull")
                return 0
            raise X1Error(
                f"{url} holds no complete copy (no x1-dir.json: nothing was pushed there, or a push was "
                "cut short): push the folder first, or pass --if-present"
            )
        if got == "present":
            print(f"[remote] {args.local} already holds {url}")
        return 0

    return guarded(body, os_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
