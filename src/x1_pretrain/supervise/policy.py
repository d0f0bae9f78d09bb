"""The watchdog's relaunch policy: which exit codes are relaunched (the contract's table), which end a run for
good, how one start ended (``ExitPoint``) and when two of them are a crash loop, the record of a relaunch."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any

from ..core.contract import (
    EXIT_BUDGET_CHECKPOINT,
    EXIT_BUDGET_NOW,
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_STORE_UNAVAILABLE,
    MEANINGS,
)

RELAUNCH = {e.code for e in EXIT_CODES if e.relaunched}
FOR_GOOD = {EXIT_OK, EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW}  # after these, --terminate-on-exit ends the bill
# Starts that did not train at all are never a crash loop (that rule is for starts that trained and made no
# progress): a stop after a checkpoint, and a checkpoint store that could not be reached at start.
NOT_CRASHES = frozenset({EXIT_INTERRUPTED, EXIT_STORE_UNAVAILABLE})


def describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return MEANINGS.get(code, f"exit {code}")


def should_relaunch(code: int) -> bool:
    """Relaunch after 75, 8, 7, 1 or death by a signal (negative returncode, or 128+N from a shell)."""
    return code in RELAUNCH or code < 0 or (128 < code < 160 and code != 130)


@dataclass
class Restart:
    number: int
    exit_code: int
    reason: str
    last_step: int | None
    checkpoint_step: int | None
    steps_lost: int | None
    backoff_s: float
    downtime_s: float | None = None
    relaunch_latency_s: float | None = None


@dataclass(frozen=True)
class ExitPoint:
    """How one start ended: its code, the step it reached (None: it logged no step) and the newest complete
    checkpoint then. Two consecutive starts with the same step and checkpoint are a crash loop."""

    code: int
    step: int | None
    checkpoint_step: int | None
    elsewhere: bool = False  # trained on a node without rank 0: its progress is on another machine

    def same_place(self, other: ExitPoint) -> bool:
        """Two starts ended where they began. Not knowable for a node whose trainers ran but whose progress lives
        on rank 0's machine: that node's crash loops are rank 0's node's to see (its watchdog then ends, and
        this node's next rendezvous cannot form)."""
        if self.elsewhere or other.elsewhere:
            return False
        return (self.step, self.checkpoint_step) == (other.step, other.checkpoint_step)


# How a supervision ended, when the trainer's own exit code does not say it all.
CRASH_LOOP, GAVE_UP, STOPPED = "crash_loop", "gave_up", "stopped"


def of_this_start(status: dict[str, Any] | None, started_at: float) -> bool:
    """Whether an exit record tells of the start being judged: written after it began and not later than now. An
    older one is an earlier start's; one from the future was not written here (a copy from another machine)."""
    when = status.get("time_unix") if status is not None else None
    if not isinstance(when, (int, float)) or isinstance(when, bool):
        return False
    return started_at - 1 <= when <= time.time() + 1
