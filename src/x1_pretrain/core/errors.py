"""User-facing errors and the exit codes they map to (see docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass

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


class X1Error(Exception):
    """An error caused by the user's input. Printed without a traceback.

    The message names the file or key, says what was expected, and how to fix it.
    """

    exit_code = EXIT_USAGE


class DataError(X1Error):
    """A data file or directory is missing, malformed or inconsistent."""


class TokenizerNotFound(X1Error):
    """No usable gpt2.tiktoken file could be found or fetched."""


class RankLost(X1Error):
    """Another rank of a multi-process run is gone (its process died; its machine was lost, preempted or stopped):
    a collective failed or timed out. Not the user's mistake, but said in one line like one, with exit 1, which
    the watchdog relaunches (torchrun's rendezvous then waits for every node again)."""

    exit_code = EXIT_UNEXPECTED


class CheckpointFailed(Exception):
    """The checkpoint the run must end with (the final one, or the one a stop asks for) was not written.

    Not a usage error: the run can go on from the previous complete checkpoint (exit 7, relaunched)."""

    def __init__(self, step: int, reason: str, error: BaseException) -> None:
        self.step, self.reason, self.error = step, reason, error
        super().__init__(f"the {reason} checkpoint of step {step} could not be written: {error}")
