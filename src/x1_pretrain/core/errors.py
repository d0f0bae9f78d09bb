"""User-facing errors and the exit code each maps to (the table of codes is ``core/contract.py``)."""

from __future__ import annotations

from .contract import EXIT_UNEXPECTED, EXIT_USAGE


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
