"""The watchdog's options and its start-up: the budget's second line, the full-disk wait, the end of the bill
and how to end a crash-looped run (``WatchdogOptions``), the old spelling of ``--log-file``, and ``--detach``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import X1Error
from .terminate import EndOfBill


@dataclass(frozen=True, kw_only=True)
class BudgetLine:
    """The watchdog's own budget check (the second line): where the spend is read and the cap."""

    curr_cost_uri: str  # --budget-curr-cost-uri
    cap_usd: float
    poll_s: float = 60.0
    kill_grace_s: float = 10.0


def add_disk_flags(ap: Any) -> None:
    """The watchdog's flags for a full checkpoint disk (``Watchdog._wait_for_space``)."""
    d = ap.add_argument_group("a full checkpoint disk (after exit 7)")
    d.add_argument(
        "--disk-poll-s",
        type=float,
        default=30.0,
        help="seconds between two looks at the free space while the checkpoint disk is too full for a checkpoint (30)",
    )
    d.add_argument(
        "--disk-margin-mb",
        type=float,
        default=256.0,
        help="free space a relaunch needs beyond the newest checkpoint's size, MB (256)",
    )


def disk_options(args: Any) -> dict[str, float]:
    if args.disk_poll_s <= 0 or args.disk_margin_mb < 0:
        raise X1Error("--disk-poll-s must be positive and --disk-margin-mb >= 0")
    return {"disk_poll_s": args.disk_poll_s, "disk_margin_mb": args.disk_margin_mb}


@dataclass(frozen=True, kw_only=True)
class WatchdogOptions:
    max_restarts: int = 20
    backoff_s: float = 5.0
    max_backoff_s: float = 60.0
    events_file: Path | None = None  # one JSON line per event
    log_file: Path | None = None  # the text log: where output goes when no terminal takes it
    budget_line: BudgetLine | None = None
    end_of_bill: EndOfBill | None = None
    alerter: Any = None
    mlflow_uri: str | None = None  # the trainer's store (to end a crash-looped run at its last checkpoint)
    # ends a crash-looped run at its last checkpoint (final files, MLflow run FINISHED): the trainer's
    # launch.session.end_at_last_checkpoint, handed in by the command, since the watchdog never imports the trainer
    end_run: Callable[..., bool] | None = None
    disk_poll_s: float = 30.0  # a full checkpoint disk: seconds between two looks at its free space
    disk_margin_mb: float = 256.0  # free space a relaunch needs beyond the size of the newest checkpoint


def launch_detached(argv: list[str], log_file: Path) -> int:
    """Start this same watchdog (without --detach) in the background, in its own session, stdin from /dev/null,
    output appended to ``log_file``; print its pid and how to follow and stop it."""
    cut = argv.index("--")
    rest = [a for a in argv[:cut] if a != "--detach"] + argv[cut:]
    log_file = log_file.resolve()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "x1_pretrain.watchdog", *rest],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=1.0)  # a watchdog that fails at once is reported here, not lost in the log
    except subprocess.TimeoutExpired:
        code = None
    if code is not None:
        print(f"error: the detached watchdog exited at once with {code}; see {log_file}", file=sys.stderr)
        return code or 1
    print(
        f"[watchdog] running in the background as pid {proc.pid}, in its own session: closing this terminal does "
        f"not touch it\n  follow: tail -f {log_file}\n  stop:   kill -TERM {proc.pid}   (the trainer checkpoints "
        "and exits 75; the watchdog does not relaunch)"
    )
    return 0


def old_log_file(events_file: Path | None, log_file: Path | None) -> tuple[Path | None, Path | None]:
    """(events file, log file): before --events-file existed, --log-file held the JSON events, and a FILE.jsonl
    still does, for one release, with a notice."""
    if log_file is not None and log_file.suffix == ".jsonl" and events_file is None:
        print(
            f"[watchdog] deprecated: --log-file {log_file} (JSON lines) is now --events-file; --log-file is "
            "the text log",
            file=sys.stderr,
        )
        return log_file, None
    return events_file, log_file
