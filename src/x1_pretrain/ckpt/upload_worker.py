"""Both ends of the mirror's upload process (``UploadProcess`` in the trainer, ``main`` in the child). The child
uploads files to the object store on behalf of a trainer, so the client's Python work (signing, HTTP,
checksums) never takes the training process's GIL, at a lower CPU priority than training.

Protocol, one JSON object a line: the trainer writes ``{"id": N, "url": "s3://B/P", "path": "/abs/file", "rel":
"key", "timeouts": [connect, read, attempts], "metadata": {...}}`` to stdin; the worker answers ``{"id": N,
"ok": true, "bytes": M}`` or ``{"id": N, "ok": false, "kind": "...", "detail": "..."}`` on stdout (anything else
printed goes to stderr).
It runs in a session of its own, so a signal to the trainer's process group (a preemption, a closed terminal)
does not end the upload of the stop checkpoint, and it ignores SIGINT, SIGTERM and SIGHUP besides. It ends when
the trainer closes its stdin or kills it, and on Linux is killed when the trainer dies (PR_SET_PDEATHSIG), so no
upload outlives the process that asked for it (elsewhere it finishes the file in hand, then sees stdin close).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from ..core.log import Log
from .objstore import RemoteURL, Store, StoreError, scrub


class UploadProcess:
    """The upload worker (``main`` below): a child process started on first use, niced, in a session
    of its own (a signal to the trainer's process group does not reach it), that uploads one file per request.
    A worker that dies or does not answer in time is killed and started again at the next request; after
    ``MAX_DEATHS`` in a row the mirror uploads in-process instead (``put_file`` returns False)."""

    MAX_DEATHS = 3
    MIN_RATE_BPS = 1 << 20  # an answer may take the store's timeouts plus the file at 1 MB/s

    def __init__(self, store: Store, log: Log) -> None:
        self.store, self._log = store, log
        self.proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._deaths = 0
        self._next_id = 0

    def _start(self) -> subprocess.Popen[str] | None:
        with self._lock:
            if self._closed:
                return None
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "x1_pretrain.ckpt.upload_worker", str(os.getpid())],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    bufsize=1,
                    start_new_session=True,
                )
            return self.proc

    def put_file(self, path: Path, rel: str, metadata: dict[str, str] | None = None) -> bool:
        """Upload through the worker: True when it did, False when the worker is given up on (the caller uploads
        in-process); a StoreError or OSError as the worker reported it."""
        if self._deaths >= self.MAX_DEATHS:
            return False
        proc = self._start()
        if proc is None:
            raise StoreError("other", "the mirror is closed")
        self._next_id += 1
        size = path.stat().st_size
        request = {
            "id": self._next_id,
            "url": str(self.store.url),
            "path": str(path.resolve()),
            "rel": rel,
            "timeouts": list(self.store.timeouts),
            "metadata": metadata or {},
        }
        connect, read, attempts = self.store.timeouts
        wait_s = (connect + read) * max(int(attempts), 1) + size / self.MIN_RATE_BPS
        answer = self._ask(proc, request, wait_s)
        if answer is None:
            self._died(proc, wait_s)
        self._deaths = 0
        if not answer.get("ok"):
            detail = scrub(str(answer.get("detail")))
            if answer.get("kind") == "local":
                raise OSError(int(answer.get("errno") or 0) or None, detail)
            raise StoreError(str(answer.get("kind")), detail)
        return True

    @staticmethod
    def _ask(proc: subprocess.Popen[str], request: dict[str, Any], wait_s: float) -> dict[str, Any] | None:
        """Send one request and read its answer within ``wait_s`` (None: no answer, a wrong one, or a dead
        worker)."""
        import select

        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], wait_s)
            line = proc.stdout.readline() if ready else ""
            answer = json.loads(line) if line else None
        except (OSError, ValueError):
            return None
        if not isinstance(answer, dict) or answer.get("id") != request["id"]:
            return None  # out of step with the worker: never take another request's answer for this one
        return answer

    def _died(self, proc: subprocess.Popen[str], wait_s: float) -> NoReturn:
        code = proc.poll()
        self._kill(proc)
        self._deaths += 1
        why = f"it exited with {code}" if code is not None else f"no answer within {wait_s:.0f} s"
        if self._deaths >= self.MAX_DEATHS:
            self._log(
                f"warning: the mirror's upload process failed {self._deaths} times in a row ({why}); "
                "uploading from the trainer's process from now on"
            )
        raise StoreError("unreachable", f"the upload process gave no answer ({why}); it is started again")

    def _kill(self, proc: subprocess.Popen[str]) -> None:
        with self._lock:
            if self.proc is proc:
                self.proc = None
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, self.proc = self.proc, None
        if proc is not None:
            self._kill(proc)


# -- the worker's side --
def serve(lines: Any, out: Any) -> None:
    stores: dict[tuple[str, tuple[float, ...]], Store] = {}
    for line in lines:
        req: Any = None
        try:
            req = json.loads(line)
            timeouts = tuple(req.get("timeouts") or (10.0, 60.0, 3))
            key = (req["url"], timeouts)
            if key not in stores:
                stores[key] = Store(RemoteURL.parse(req["url"]), timeouts[0], timeouts[1], int(timeouts[2]))
            path = Path(req["path"])
            stores[key].put_file(path, req["rel"], metadata=req.get("metadata") or None)
            answer: dict[str, Any] = {"ok": True, "bytes": path.stat().st_size}
        except StoreError as e:
            answer = {"ok": False, "kind": e.kind, "detail": e.detail}
        except OSError as e:
            answer = {
                "ok": False,
                "kind": "local",
                "errno": e.errno,
                "detail": scrub(f"{type(e).__name__}: {e.strerror or e}"),
            }
        except Exception as e:  # a bad request or a client surprise: said, never a dead worker
            answer = {"ok": False, "kind": "other", "detail": scrub(f"{type(e).__name__}: {e}")}
        answer["id"] = req.get("id") if isinstance(req, dict) else None  # the trainer matches answers by id
        out.write(json.dumps(answer) + "\n")
        out.flush()


def _die_with_parent(parent: int) -> None:
    """Linux's PR_SET_PDEATHSIG: SIGKILL this worker when the mirror's thread that started it ends."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if parent and os.getppid() != parent:  # the trainer was gone before the line above took effect
        raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    _die_with_parent(int(args[0]) if args else 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(10)  # training first
    # the protocol keeps the real stdout; anything else printing here (a library's warning) goes to stderr
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, protocol)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
