"""User-facing errors and the exit codes they map to (see docs/architecture.md)."""

from __future__ import annotations

# Exit codes of the CLIs. The watchdog relaunches EXIT_INTERRUPTED, EXIT_CHECKPOINT_FAILED and EXIT_UNEXPECTED.
EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_BUDGET_CHECKPOINT = 3
EXIT_BUDGET_NOW = 4
EXIT_DIVERGED = 5
EXIT_SLOW = 6
EXIT_CHECKPOINT_FAILED = 7  # the final or the stop checkpoint could not be written (the last good one stays)
EXIT_INTERRUPTED = 75
EXIT_ABORTED = 130  # a second SIGINT: stopped at once, no checkpoint


class X1Error(Exception):
    """An error caused by the user's input. Printed without a traceback.

    The message names the file or key, says what was expected, and how to fix it.
    """

    exit_code = EXIT_USAGE


class DataError(X1Error):
    """A data file or directory is missing, malformed or inconsistent."""


class TokenizerNotFound(X1Error):
    """No usable gpt2.tiktoken file could be found or fetched."""


class CheckpointFailed(Exception):
    """The checkpoint the run must end with (the final one, or the one a stop asks for) was not written.

    Not a usage error: the run can go on from the previous complete checkpoint (exit 7, relaunched)."""

    def __init__(self, step: int, reason: str, error: BaseException) -> None:
        self.step, self.reason, self.error = step, reason, error
        super().__init__(f"the {reason} checkpoint of step {step} could not be written: {error}")
