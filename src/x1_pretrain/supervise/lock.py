"""One trainer per checkpoint dir: ``<ckpt-dir>/trainer.lock``.

The lock is an ``flock`` on that file, held for the life of the process, so it goes away with the process
however it ends (SIGKILL included); the file also names its holder (pid, host, start time, command) so a
second trainer can say who holds it. A lock file left by a process that is gone is taken over, and the
takeover is logged. Two trainers on one dir would train the same steps into the same MLflow run at
double the cost: the second one exits 2 before it spends anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.errors import X1Error
from ..core.fileio import pid_alive

LOCK_FILE = "trainer.lock"


def _describe(holder: dict[str, Any]) -> str:
    since = holder.get("started_utc", "?")
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {since})"


def _alive_here(holder: dict[str, Any]) -> bool:
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    return pid_alive(holder["pid"])


class RunLock:
    def __init__(self, ckpt_dir: Path, log: Callable[[str], None] = print) -> None:
        self.path = ckpt_dir / LOCK_FILE
        self._log = log
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise X1Error(
                f"--ckpt-dir {self.path.parent} cannot be created or written ({e.strerror}); choose a "
                "writable directory"
            ) from None
        previous = self._read(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise X1Error(
                f"{self.path.parent} is in use by another trainer: {_describe(previous)}. Two trainers on "
                "one checkpoint dir would train the same steps twice at double the cost; stop that one "
                "first (or wait for it), or choose another --ckpt-dir"
            ) from None
        except OSError as e:  # a file system without flock (some network mounts)
            if previous and _alive_here(previous) and previous.get("pid") != os.getpid():
                os.close(fd)
                raise X1Error(f"{self.path.parent} is in use by another trainer: {_describe(previous)}") from None
            self._log(f"warning: {self.path} cannot be locked ({e.strerror}); relying on its pid check only")
        if previous.get("pid") not in (None, os.getpid()):
            self._log(f"took over a stale lock on {self.path.parent}: {_describe(previous)} is gone")
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "argv": sys.argv[:1],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd

    @staticmethod
    def _read(fd: int) -> dict[str, Any]:
        try:
            data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def release(self) -> None:
        """Clear the holder and unlock (a clean exit leaves no stale lock to take over)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None
