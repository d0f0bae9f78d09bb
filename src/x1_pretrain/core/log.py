"""The one logging path: the standard ``logging`` module, one line format, one ``--log-level`` flag.

Each module logs through its own ``logging.getLogger(__name__)``; a command calls ``setup`` once with its
``--log-level``. A line reads ``2026-12-07 10:58:02 INFO    trainer.loop: step 10/100 | loss ...``: time,
level, component (the module, without the package name), message. Lines below WARNING go to standard output
(the watchdog's, the billing sidecar's and budget_serve's to standard error: background processes, and the
watchdog keeps the trainer's standard output apart from its own lines);
warnings and errors always go to standard error. The streams are looked up at each line, so the
closed-terminal guard of ``core.console`` (which replaces ``sys.stdout``/``sys.stderr``) covers them.

What other programs read is not a log line and does not go through here: MLflow metrics, alerts, the ledger,
the events file, a command's own result (a table, a JSON document), and the raw note a signal handler writes
(a handler must not take the logging lock the interrupted code may hold).

A component that is handed a ``Log`` (a plain callable, so tests can pass ``list.append``) gets one from
``as_log(logger)``: its message is logged at INFO, at ERROR when it begins with ``error:``, at WARNING when it begins
with ``warning:`` (those prefixes dropped) or ``budget warning:`` (kept).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO

LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LEVEL = "info"
ROOT = "x1_pretrain"
FORMAT = "%(asctime)s %(levelname)-7s %(component)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
WARNING_PREFIXES = ("warning: ", "WARNING: ")  # dropped: the level says it
WARNING_WORDS = ("budget warning: ",)  # kept: they name what warns
ERROR_PREFIXES = ("error: ", "ERROR: ")  # dropped

Log = Callable[[str], None]


class _Stream(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to ``sys.stdout`` or ``sys.stderr`` as they are at each line, for records in
    ``[low, high)``."""

    def __init__(self, name: str, low: int, high: int) -> None:
        super().__init__()
        self._name, self._low, self._high = name, low, high

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, _value: Any) -> None:  # StreamHandler.__init__ sets it; the live stream is used instead
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        record.component = record.name.removeprefix(ROOT + ".")
        return self._low <= record.levelno < self._high and super().filter(record)


def setup(level: str = DEFAULT_LEVEL, *, info_to: str = "stdout") -> None:
    """Send x1's log lines at ``level`` and above to the console in the one format (idempotent: a second call
    replaces the first's handlers). ``info_to``: the stream for lines below WARNING (``stdout``/``stderr``)."""
    if level not in LEVELS:
        raise ValueError(f"--log-level {level!r}: one of {', '.join(LEVELS)}")
    logger = logging.getLogger(ROOT)
    for h in list(logger.handlers):
        if isinstance(h, _Stream):
            logger.removeHandler(h)
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    for handler in (_Stream(info_to, logging.NOTSET, logging.WARNING), _Stream("stderr", logging.WARNING, 1 << 30)):
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def ensure() -> None:
    """``setup`` at the default level unless a command set the lines up already: for a notice that can come
    before the command's own ``setup`` (a renamed flag is noticed while argparse parses)."""
    if not any(isinstance(h, _Stream) for h in logging.getLogger(ROOT).handlers):
        setup()


def add_flag(parser: Any) -> None:
    """``--log-level`` for a command's parser (every command has it)."""
    parser.add_argument(
        "--log-level",
        choices=LEVELS,
        default=DEFAULT_LEVEL,
        help=f"console detail: {', '.join(LEVELS)} ({DEFAULT_LEVEL}); warning leaves out the per-step lines",
    )


def as_log(logger: logging.Logger) -> Log:
    """A ``Log`` callable writing to ``logger``: INFO; ERROR for a message that begins with ``error:`` and
    WARNING for one that begins with ``warning:`` (the prefix dropped: the level says it) or ``budget warning:``."""

    def log(msg: str) -> None:
        for prefixes, emit in ((ERROR_PREFIXES, logger.error), (WARNING_PREFIXES, logger.warning)):
            prefix = next((p for p in prefixes if msg.startswith(p)), None)
            if prefix is not None:
                emit(msg[len(prefix) :])
                return
        if msg.startswith(WARNING_WORDS):
            logger.warning(msg)
        else:
            logger.info(msg)

    return log
