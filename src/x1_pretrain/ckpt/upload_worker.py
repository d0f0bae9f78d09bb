"""The mirror's upload process: uploads files to the object store on behalf of a trainer, so the client's Python
work (signing, HTTP, checksums) never takes the training process's GIL, at a lower CPU priority than training.

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
import sys
from pathlib import Path
from typing import Any

from .objstore import RemoteURL, Store, StoreError, scrub


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
