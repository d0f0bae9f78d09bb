"""The mirror's upload process: uploads files to the object store on behalf of a trainer, so the client's Python
work (signing, HTTP, checksums) never takes the training process's GIL, at a lower CPU priority than training.

Protocol, one JSON object a line: the trainer writes ``{"url": "s3://B/P", "path": "/abs/file", "rel": "key",
"timeouts": [connect, read, attempts]}`` to stdin; the worker answers ``{"ok": true, "bytes": N}`` or ``{"ok":
false, "kind": "...", "detail": "..."}`` on stdout. It exits when stdin closes (the trainer is gone) and is
killed by the trainer's mirror when it closes. It ignores SIGINT, SIGTERM and SIGHUP: a signal sent to the
trainer's process group (a preemption, a closed terminal) must not end the upload of the stop checkpoint; the
worker ends when the trainer closes its stdin or kills it, and (on Linux) is killed when the trainer dies,
so no upload outlives the process that asked for it.
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

from ..core.objstore import RemoteURL, Store, StoreError


def serve(lines: Any, out: Any) -> None:
    stores: dict[tuple[str, tuple[float, ...]], Store] = {}
    for line in lines:
        try:
            req = json.loads(line)
            timeouts = tuple(req.get("timeouts") or (10.0, 60.0, 3))
            key = (req["url"], timeouts)
            if key not in stores:
                stores[key] = Store(RemoteURL.parse(req["url"]), timeouts[0], timeouts[1], int(timeouts[2]))
            path = Path(req["path"])
            stores[key].put_file(path, req["rel"])
            answer: dict[str, Any] = {"ok": True, "bytes": path.stat().st_size}
        except StoreError as e:
            answer = {"ok": False, "kind": e.kind, "detail": e.detail}
        except OSError as e:
            answer = {"ok": False, "kind": "local", "detail": f"{type(e).__name__}: {e.strerror or e}"}
        except Exception as e:   # a bad request or a client surprise: said, never a dead worker
            answer = {"ok": False, "kind": "other", "detail": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def _die_with_parent(parent: int) -> None:
    """Linux's PR_SET_PDEATHSIG: SIGKILL this worker when the mirror's thread that started it ends."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # 1: PR_SET_PDEATHSIG
    if parent and os.getppid() != parent:   # the trainer was gone before the line above took effect
        raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    _die_with_parent(int(args[0]) if args else 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(10)   # training first
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
