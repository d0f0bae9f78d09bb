"""Console output that survives a closed terminal.

When the SSH session or terminal window that started a run closes, every later write to it fails (EIO on a
hung-up terminal, EPIPE on a gone reader). A ``print`` that raises there would kill the process at the worst
moment: the watchdog before it forwards the stop, the trainer before its stop checkpoint. Inside
:func:`guarded_console` the standard streams are wrapped: the first write or flush that fails moves the
stream's descriptor onto the log file (``X1_LOG_FILE`` or the path given) or, without one, onto
``/dev/null``. What the stream's buffer holds is flushed there, and everything later (C extensions, child
processes that inherit the descriptor, Python's own flush at exit) goes there too. Output is dropped, never the run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from .contract import LOG_FILE_ENV


class _Resilient:
    """A text stream whose writes and flushes never raise ``OSError``: on the first failure the descriptor is
    diverted (see the module's docstring) and what the buffer holds is flushed there."""

    def __init__(self, stream: TextIO, divert_to: Path | None) -> None:
        self._stream = stream
        self._divert_to = divert_to
        self.diverted: str | None = None  # where output went once the terminal failed

    def _divert(self) -> None:
        if self.diverted is not None:
            return
        target = self._divert_to
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):
            self.diverted = "nowhere (the stream has no descriptor)"
            return
        try:
            new = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if target is not None else -1
        except OSError:
            new, target = -1, None
        if new < 0:
            new = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(new, fd)
        finally:
            os.close(new)
        self.diverted = str(target) if target is not None else os.devnull

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            # The buffer below already holds what failed to go out: a flush sends it to the new descriptor (a
            # second write of ``text`` would print it twice). Text that never reached the buffer is dropped.
            self._divert()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._divert()
            with contextlib.suppress(OSError, ValueError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def log_file_from_env() -> Path | None:
    value = os.environ.get(LOG_FILE_ENV, "").strip()
    return Path(value) if value else None


@contextlib.contextmanager
def guarded_console(log_file: Path | None = None) -> Iterator[None]:
    """Inside: ``sys.stdout`` and ``sys.stderr`` never raise on a closed terminal (see the module)."""
    target = log_file if log_file is not None else log_file_from_env()
    saved = sys.stdout, sys.stderr
    if isinstance(sys.stdout, _Resilient):  # nested (a command calling another in-process)
        yield
        return
    sys.stdout = _Resilient(saved[0], target)
    sys.stderr = _Resilient(saved[1], target)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        sys.stdout, sys.stderr = saved
