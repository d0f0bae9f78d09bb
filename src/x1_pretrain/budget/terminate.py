"""Ending the bill (the watchdog's ``--terminate-on-exit``): once the trainer has ended for good (finished,
or a budget stop), export the run into the directory the user named, then ask the provider to terminate the
instance, log the answer and alert. A forgotten A100 at $1.10/h is $26 a day.

When the export fails after a finished run or a checkpointed budget stop (exit 0 or 3), the instance is
NOT terminated: its disk may hold the only copy of the weights, and the alert says so. After exit 4 (the
spend is already over the cap) it is terminated even if the export fails; the lab keeps checkpoints on the
persistent disk, which outlives the instance.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import EXIT_BUDGET_NOW
from .providers import ApiSource, PollError, SelectionError


@dataclass(frozen=True)
class EndOfBill:
    source: ApiSource              # the provider, its key and the followed instance/pod
    export_to: Path                # export_run --output
    mlflow_uri: str                # where the trainer logged
    export_timeout_s: float = 1800.0


def export_run(end: EndOfBill, log: Callable[[str], None]) -> bool:
    cmd = [sys.executable, "-m", "x1_pretrain.export_run", "--mlflow-uri", end.mlflow_uri, "--output",
           str(end.export_to), "--overwrite"]
    log(f"exporting the run to {end.export_to} before terminating the instance")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=end.export_timeout_s)
    except subprocess.TimeoutExpired:
        log(f"export_run did not finish within {end.export_timeout_s:g} s")
        return False
    for line in (r.stdout + r.stderr).strip().splitlines()[-6:]:
        log(f"  export_run: {line}")
    return r.returncode == 0


def end_the_bill(end: EndOfBill, exit_code: int, log: Callable[[str], None], alerter: Any) -> bool:
    """Export, then terminate; True when the provider confirmed the termination."""
    exported = export_run(end, log)
    what = f"{end.source.provider} {end.source.resource_id or '(the only running instance)'}"
    if not exported and exit_code != EXIT_BUDGET_NOW:
        msg = (f"the trainer ended (exit {exit_code}) but export_run to {end.export_to} FAILED, so {what} was NOT "
               "terminated: its disk may hold the only copy of the weights. Export by hand, then terminate it "
               "from the provider's dashboard (it keeps billing until you do).")
        log(msg)
        alerter.send_within("x1: instance NOT terminated (export failed)", msg)
        return False
    try:
        answer = end.source.terminate()
    except (PollError, SelectionError) as e:
        msg = f"terminating {what} FAILED ({e}); terminate it from the provider's dashboard now: it keeps billing"
        log(msg)
        alerter.send_within("x1: terminate FAILED", msg)
        return False
    msg = (f"{answer} after exit {exit_code}; run exported to {end.export_to}" if exported else
           f"{answer} after exit {exit_code} (the spend was over the cap; export_run failed: see the log)")
    log(msg)
    alerter.send_within("x1: instance terminated", msg + ". Confirm it in the dashboard and save the screenshot "
                        "for the DoD (termination*.png in the run bundle).")
    return True
