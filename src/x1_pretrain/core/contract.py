"""The contract between the watchdog and the trainer it starts: everything one process tells the other.

The watchdog (``supervise/``) never imports the trainer, and the trainer (``trainer/``, ``launch/``) never
imports the watchdog: both import this module, and no other module spells these names.

* **The environment** the watchdog sets for each trainer it starts (``*_ENV``).
* **The files** in the checkpoint dir: ``progress.json`` (the ``Progress`` record, written by the trainer at its
  first step, every ``log_every`` steps and after each checkpoint) and ``exit_status.json`` (rank 0's exit code
  and reason, since torchrun reports any failing worker as 1).
* **The exit codes** (``EXIT_CODES``, the one table: ``train --help``, the watchdog's help, messages and
  relaunch policy, README's table and SkyPilot's recovery follow it; ``tests/core/test_errors.py`` checks them).
* **The trainer's command line** as the watchdog reads it (``flag_of``, ``ckpt_dir_of``, ``with_resume``).

The standard library only (``core.fileio``'s atomic write is imported where a record is written, since
``core.errors``, which ``fileio`` needs, takes its exit codes from here): the watchdog imports it at start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)

# -- the environment the watchdog sets for the trainer --
WATCHDOG_PID_ENV = "X1_WATCHDOG_PID"  # the watchdog's pid: a trainer whose watchdog is gone stops (exit 75)
LOG_FILE_ENV = "X1_LOG_FILE"  # where output goes once the terminal is gone
EXIT_STATUS_ENV = "X1_EXIT_STATUS"  # a status file the watchdog owns (0600) and reads after each child
RESTART_COUNT_ENV = "X1_RESTART_COUNT"  # how many times the watchdog relaunched (0 for the first start)

# -- the files in the checkpoint dir --
PROGRESS = "progress.json"
EXIT_STATUS = "exit_status.json"


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What ``progress.json`` holds: which process trains, where it is, and its timings (Unix seconds)."""

    pid: int
    step: int
    time_unix: float  # when this record was written
    started_unix: float  # when this trainer process started
    first_step_started_unix: float | None  # when its first step began (the relaunch latency ends there)
    first_step_s: float | None  # how long that first step took (compile included)
    last_checkpoint_step: int | None
    total_steps: int


# Exit codes of the CLIs. The watchdog relaunches EXIT_INTERRUPTED, EXIT_CHECKPOINT_FAILED, EXIT_STORE_UNAVAILABLE
# and EXIT_UNEXPECTED.
EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_BUDGET_CHECKPOINT = 3
EXIT_BUDGET_NOW = 4
EXIT_DIVERGED = 5
EXIT_SLOW = 6
EXIT_CHECKPOINT_FAILED = 7  # the final or the stop checkpoint could not be written: the full-disk code
EXIT_STORE_UNAVAILABLE = 8  # the checkpoint store could not be reached at start (after checkpoint.remote_wait_min)
EXIT_INTERRUPTED = 75
EXIT_ABORTED = 130  # a second SIGINT: stopped at once, no checkpoint


@dataclass(frozen=True)
class ExitCode:
    code: int
    short: str  # in the watchdog's one-line messages
    meaning: str
    relaunched: bool  # by the watchdog (and SkyPilot's recovery)


# The one table of what the trainer's exit codes mean: `train --help`, the watchdog's policy and messages use it;
# README's table and the docs are checked against it (tests/core/test_errors.py).
EXIT_CODES = (
    ExitCode(EXIT_OK, "finished", "finished", False),
    ExitCode(EXIT_UNEXPECTED, "unexpected failure", "unexpected failure (a bug, a crash)", True),
    ExitCode(
        EXIT_USAGE,
        "bad usage/config/data",
        "bad usage, config or data (the message names the key or file and the fix)",
        False,
    ),
    ExitCode(
        EXIT_BUDGET_CHECKPOINT,
        "budget stop (checkpointed)",
        "budget stop with a checkpoint (projected total above the cap, spend unknown too long, or launch refused)",
        False,
    ),
    ExitCode(
        EXIT_BUDGET_NOW, "budget stop (no checkpoint)", "budget stop without a checkpoint (spent above the cap)", False
    ),
    ExitCode(
        EXIT_DIVERGED,
        "diverged",
        "diverged: NaN/Inf loss or grad norm (no checkpoint written from those weights)",
        False,
    ),
    ExitCode(
        EXIT_SLOW,
        "throughput below floor",
        "throughput below --min-tokens-per-s (in the first --min-tokens-per-s-window-min minutes)",
        False,
    ),
    ExitCode(
        EXIT_CHECKPOINT_FAILED,
        "the final or stop checkpoint could not be written (the last good one is kept)",
        "the final or the stop checkpoint could not be written (a full disk; or another write the run cannot "
        "skip); the last complete one stays latest, and the watchdog waits for free space before it "
        "relaunches",
        True,
    ),
    ExitCode(
        EXIT_STORE_UNAVAILABLE,
        "the checkpoint store could not be reached at start",
        "the checkpoint store (--ckpt-remote) could not be reached at start within checkpoint.remote_wait_min "
        "minutes, with nothing local to resume from",
        True,
    ),
    ExitCode(
        EXIT_INTERRUPTED,
        "interrupted after a checkpoint",
        "interrupted by SIGTERM/SIGINT/SIGHUP (a closed terminal) after a clean checkpoint",
        True,
    ),
    ExitCode(EXIT_ABORTED, "aborted by a second SIGINT", "aborted by a second SIGINT (no checkpoint)", False),
)
MEANINGS = {e.code: e.short for e in EXIT_CODES}


def exit_code_help(short: bool = False) -> str:
    """The exit-code lines of a command's --help (the trainer's; ``short`` for the watchdog's)."""
    return "Exit codes of train (the watchdog relaunches those marked *):\n" + "\n".join(
        f"  {e.code:>3}{'*' if e.relaunched else ' '} {e.short if short else e.meaning}" for e in EXIT_CODES
    )


def write_progress(ckpt_dir: Path, progress: Progress) -> None:
    """The trainer's progress record, replaced atomically."""
    from .fileio import write_text_atomic

    write_text_atomic(ckpt_dir / PROGRESS, json.dumps(dataclasses.asdict(progress), sort_keys=True))


def write_exit_status(ckpt_dir: Path | None, code: int, reason: str) -> None:
    """Rank 0's exit code, for the watchdog: torchrun reports any failing worker as 1, which would hide a
    budget stop (3, 4), a divergence (5) or a usage error (2) behind a relaunchable code. Written into an
    existing checkpoint dir (a typo in the flags must not create directories; None: another node's first
    process, which writes only for its own watchdog) and to ``$X1_EXIT_STATUS``."""
    from .fileio import write_text_atomic

    blob = json.dumps(
        {
            "exit_code": code,
            "reason": reason,
            "pid": os.getpid(),
            "time_unix": time.time(),
            "rank": int(os.environ.get("RANK", "0") or 0),
        }
    )
    failed: OSError | None = None
    if ckpt_dir is not None and ckpt_dir.is_dir():
        try:
            write_text_atomic(ckpt_dir / EXIT_STATUS, blob)
        except OSError as e:  # a full disk: the watchdog's own file (maybe on another disk) is still tried
            failed = e
    if os.environ.get(EXIT_STATUS_ENV):  # the watchdog's own file in the run's dir: for its owner only
        write_text_atomic(Path(os.environ[EXIT_STATUS_ENV]), blob, mode=0o600)
    if failed is not None:
        raise failed


def record_exit_status(ckpt_dir: Path | None, code: int, reason: str) -> None:
    """``write_exit_status`` for exit paths: a failure to record is a warning, never a second error."""
    try:
        write_exit_status(ckpt_dir, code, reason)
    except OSError as e:
        _log.warning(f"could not record the exit status in {ckpt_dir} ({e})")


def read_exit_status(path: Path) -> dict[str, Any] | None:
    """The status in ``path`` (a file, or a checkpoint dir holding exit_status.json)."""
    try:
        data = json.loads((path / EXIT_STATUS if path.is_dir() else path).read_text())
        return data if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None
    except (OSError, json.JSONDecodeError):
        return None


def read_progress(ckpt_dir: Path) -> dict[str, Any] | None:
    """The progress record as written (the fields of ``Progress``; an older trainer's may lack some), or None."""
    try:
        data = json.loads((ckpt_dir / PROGRESS).read_text())
        return data if isinstance(data, dict) else None
    except (OSError, json.JSONDecodeError):
        return None


# -- the trainer's command line, as the watchdog reads it --
def with_resume(cmd: list[str]) -> list[str]:
    return cmd if "--resume-from-latest" in cmd else [*cmd, "--resume-from-latest"]


def flag_of(cmd: list[str], flag: str) -> str | None:
    """The value of ``--flag V`` or ``--flag=V`` in a command line."""
    for i, a in enumerate(cmd):
        if a == flag and i + 1 < len(cmd):
            return cmd[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def ckpt_dir_of(cmd: list[str]) -> Path:
    return Path(flag_of(cmd, "--ckpt-dir") or "checkpoints")
