"""Ending the bill (the watchdog's ``--terminate-on-exit``): once the trainer has ended for good (finished,
or a budget stop), export the run into the directory the user named, put the deliverables off the machine,
then ask the provider to terminate the instance, log the answer and alert. A forgotten A100 at $1.10/h is $26
a day.

Terminating destroys the instance's own disk, and with it an export written there. So the bundle goes to the
remote (``--bundle-remote``, by default ``<--ckpt-remote>/bundle``) and the final checkpoint beside it
(``<bundle remote>/checkpoint``), each through ``ckpt.remote_dir.push`` (a manifest of every file's size and
sha256, last), and both are read back and checked (the manifest, then a head of every object: size and sha256)
BEFORE the terminate call. Without a remote the instance is never terminated: the export would be destroyed.

When the export, the upload or its check fails after a finished run or a checkpointed budget stop (exit 0 or
3), the instance is NOT terminated: its disk may hold the only copy of the weights, and the alert names what is
missing and the hourly rate still billed. After exit 4 (the spend is already over the cap) it is terminated
even if the export or the upload fails (the cap comes first; the checkpoints ``--ckpt-remote`` mirrored stay
in the bucket), and the alert names what did not get off the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget.providers import APIS, ApiSource, PollError, SelectionError
from ..ckpt import remote_dir
from ..ckpt.objstore import RemoteURL, Store, StoreError
from ..core.contract import EXIT_BUDGET_NOW
from ..core.errors import X1Error

CHECKPOINT_SUBDIR = "checkpoint"  # <bundle remote>/checkpoint: the final checkpoint's files


@dataclass(frozen=True)
class EndOfBill:
    source: ApiSource  # the provider, its key and the followed instance/pod
    export_to: Path  # export_run --output
    mlflow_uri: str  # where the trainer logged
    export_timeout_s: float = 1800.0
    bundle_remote: str | None = None  # s3://…: the bundle (and the final checkpoint under /checkpoint) go here
    run_dir: Path | None = None  # the trainer's --ckpt-dir: its x1-run.json says which run pushes


def add_flags(ap: Any) -> None:
    """The watchdog's "ending the bill" flags."""
    e = ap.add_argument_group("ending the bill")
    e.add_argument("--terminate-on-exit", choices=tuple(APIS), help="terminate the instance at the end")
    e.add_argument("--export-to", type=Path, help="export_run --output before terminating (required with it)")
    e.add_argument(
        "--bundle-remote",
        metavar="s3://BUCKET/PREFIX",
        help="where the bundle (and the final checkpoint, under /checkpoint) go, verified, before the "
        "terminate call (default: the train command's --ckpt-remote + /bundle; without either, "
        "--terminate-on-exit is refused: the instance's own disk goes with it)",
    )
    for api in APIS.values():
        e.add_argument(api.id_flag, help=api.id_help(f"${api.id_env}, else " if api.id_env else ""))
    e.add_argument("--api-key-env", help="env var holding the provider's API key")
    e.add_argument(
        "--provider-base-url", help="provider API base URL (default: the provider's; the sidecar's --provider-base-url)"
    )


def bundle_remote_of(given: str | None, ckpt_remote: str | None, export_to: Path) -> str:
    """Where the bundle goes before the instance is terminated: --bundle-remote, else <--ckpt-remote>/bundle."""
    url = given or (ckpt_remote.rstrip("/") + "/bundle" if ckpt_remote else None)
    if url is None:
        raise X1Error(
            f"--terminate-on-exit with no remote: the bundle would be exported to {export_to} on this "
            "instance's own disk, which terminating the instance destroys. Give --bundle-remote "
            "s3://BUCKET/PREFIX, or train with --ckpt-remote s3://BUCKET/PREFIX (the bundle then goes "
            "to PREFIX/bundle)"
        )
    RemoteURL.parse(url, what="--bundle-remote")  # a malformed URL is refused now, not at the end of the run
    return url


def from_flags(args: Any, ckpt_remote: str | None, mlflow_uri: str) -> EndOfBill | None:
    """The end of the bill the flags ask for (None without --terminate-on-exit); X1Error for what is missing."""
    provider = args.terminate_on_exit
    if not provider:
        return None
    if args.export_to is None:
        raise X1Error("--terminate-on-exit needs --export-to DIR: the run is exported before the instance goes")
    bundle_remote = bundle_remote_of(args.bundle_remote, ckpt_remote, args.export_to)
    api = APIS[provider]
    key_env = args.api_key_env or api.key_env
    key = os.environ.get(key_env, "").strip()
    if not key:
        raise X1Error(f"--terminate-on-exit {provider}: environment variable {key_env} is not set")
    rid = getattr(args, api.id_dest) or (os.environ.get(api.id_env) if api.id_env else None)
    source = ApiSource(provider, args.provider_base_url or api.base_url, key, key_env, 20.0, rid)
    return EndOfBill(source, args.export_to, mlflow_uri, bundle_remote=bundle_remote)


def export_run(end: EndOfBill, log: Callable[[str], None]) -> bool:
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.export_run",
        "--mlflow-uri",
        end.mlflow_uri,
        "--output",
        str(end.export_to),
        "--overwrite",
    ]
    log(f"exporting the run to {end.export_to} before terminating the instance")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=end.export_timeout_s)
    except subprocess.TimeoutExpired:
        log(f"export_run did not finish within {end.export_timeout_s:g} s")
        return False
    for line in (r.stdout + r.stderr).strip().splitlines()[-6:]:
        log(f"  export_run: {line}")
    return r.returncode == 0


def _push_verified(url: str, local: Path, log: Callable[[str], None]) -> list[str]:
    """Push one folder and check it back; what the remote lacks (empty: all of it is there)."""
    try:
        store = Store(RemoteURL.parse(url, what="--bundle-remote"))
        remote_dir.push(store, local, log)
        return remote_dir.verify(store, local)
    except StoreError as e:
        return [f"{url}: the upload of {local} failed ({e.kind}: {e.detail})"]
    except (X1Error, OSError) as e:
        return [f"{url}: the upload of {local} failed ({e})"]


def refused_push(end: EndOfBill) -> str | None:
    """Why the bundle remote may not be written (None: it may): a prefix another run owns (the nearest
    ``x1-run.json`` at or above it names another id than this run's, read from ``--ckpt-dir`` or
    ``$X1_RUN_ID``), or an owner that cannot be read; nothing is pushed then."""
    assert end.bundle_remote is not None
    try:
        remote_dir.check_owner(
            Store(RemoteURL.parse(end.bundle_remote, what="--bundle-remote")),
            remote_dir.run_id_for(end.run_dir),
            f"the train command's --ckpt-dir holds its x1-run.json, or {remote_dir.RUN_ID_ENV}",
        )
    except X1Error as e:
        return str(e)
    except StoreError as e:
        return f"the owner ({remote_dir.RUN_FILE}) above {end.bundle_remote} could not be read ({e.kind}: {e.detail})"
    return None


def offload(end: EndOfBill, final_checkpoint: Path | None, log: Callable[[str], None]) -> list[str]:
    """The bundle to the bundle remote and the final checkpoint to its ``checkpoint/``, both verified, unless
    the remote belongs to another run (:func:`refused_push`: nothing written); returns what is not off the
    machine (empty when all of it is)."""
    assert end.bundle_remote is not None
    remote = end.bundle_remote.rstrip("/")
    refused = refused_push(end)
    if refused is not None:
        log(f"error: {refused}")
        return [f"{remote}: not written ({refused})", f"{remote}/{CHECKPOINT_SUBDIR}: not written either"]
    missing = _push_verified(remote, end.export_to, log)
    if final_checkpoint is None:
        missing.append(f"{remote}/{CHECKPOINT_SUBDIR}: no complete final checkpoint on this disk to upload")
    else:
        missing += _push_verified(f"{remote}/{CHECKPOINT_SUBDIR}", final_checkpoint, log)
    if not missing:
        log(
            f"the bundle and the final checkpoint ({final_checkpoint.name if final_checkpoint else '?'}) are in "
            f"{remote}, every size and sha256 read back"
        )
    return missing


def _billing(end: EndOfBill) -> str:
    """The hourly rate still billed, as the provider reports it (for the alerts that leave an instance up)."""
    try:
        rate = end.source.read().rate_usd_per_hr
    except (PollError, SelectionError) as e:
        return f"at its hourly rate (the provider could not be read: {e})"
    return f"${rate:.2f}/h (${rate * 24:.2f} a day)"


def _kept(end: EndOfBill, what: str, why: str, log: Callable[[str], None], alerter: Any, subject: str) -> bool:
    msg = (
        f"{why}, so {what} was NOT terminated. It keeps billing {_billing(end)} until you terminate it from "
        "the provider's dashboard."
    )
    log(f"warning: {msg}")
    alerter.send_within(subject, msg)
    return False


def end_the_bill(
    end: EndOfBill, exit_code: int, log: Callable[[str], None], alerter: Any, final_checkpoint: Path | None = None
) -> bool:
    """Export, put the bundle and ``final_checkpoint`` (a step dir) off the machine, then terminate; True when
    the provider confirmed the termination."""
    exported = export_run(end, log)
    what = f"{end.source.provider} {end.source.resource_id or '(the only running instance)'}"
    over_cap = exit_code == EXIT_BUDGET_NOW
    if not exported and not over_cap:
        return _kept(
            end,
            what,
            f"the trainer ended (exit {exit_code}) but export_run to {end.export_to} FAILED: "
            "its disk may hold the only copy of the weights. Export by hand",
            log,
            alerter,
            "x1: instance NOT terminated (export failed)",
        )
    if end.bundle_remote is None:
        return _kept(
            end,
            what,
            f"no remote for the bundle: it is in {end.export_to} on this instance's own disk, "
            "which terminating destroys. Give --bundle-remote s3://BUCKET/PREFIX (or train with "
            "--ckpt-remote: the bundle goes to PREFIX/bundle); now copy it off by hand",
            log,
            alerter,
            "x1: instance NOT terminated (no remote for the bundle)",
        )
    missing = offload(end, final_checkpoint, log) if exported else [f"{end.export_to}: export_run failed"]
    if missing and not over_cap:
        return _kept(
            end,
            what,
            f"the deliverables are not all off the machine (missing: {'; '.join(missing)}). "
            f"Copy them off by hand (python -m x1_pretrain.remote push {end.export_to} "
            f"{end.bundle_remote})",
            log,
            alerter,
            "x1: instance NOT terminated (bundle not uploaded)",
        )
    try:
        answer = end.source.terminate()
    except (PollError, SelectionError) as e:
        msg = f"terminating {what} FAILED ({e}); terminate it from the provider's dashboard now: it keeps billing"
        log(f"error: {msg}")
        alerter.send_within("x1: terminate FAILED", msg)
        return False
    msg = (
        f"{answer} after exit {exit_code}; the bundle and the final checkpoint are in {end.bundle_remote}"
        if not missing
        else f"{answer} after exit {exit_code} (the spend was over the cap) although these did "
        f"not get off the machine: {'; '.join(missing)}"
    )
    log(msg)
    alerter.send_within(
        "x1: instance terminated",
        msg + ". Confirm it in the dashboard and save the screenshot for the DoD (termination*.png in the run bundle).",
    )
    return True
