"""HTTP requests with a total deadline.

``urllib``'s ``timeout`` bounds each socket operation, not the request: a server that sends one byte every
0.1 s keeps a "1 s timeout" read alive for as long as it likes. Here the request runs on a helper thread
and the caller waits at most ``deadline_s``; when the deadline passes the connection is shut down under
the helper (which then fails and ends) and the caller gets :class:`HttpError` ``timeout``.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit


class HttpError(Exception):
    """One failed request; ``kind`` is short and fixed (``timeout``, ``HTTP 503``, ``network error``)."""

    def __init__(self, kind: str, detail: str = "", status: int | None = None) -> None:
        super().__init__(kind)
        self.kind, self.detail, self.status = kind, detail, status

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes


def request(
    url: str,
    deadline_s: float,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Response:
    """Send one request and read the whole answer within ``deadline_s`` seconds (connect included).

    Non-2xx answers raise ``HttpError("HTTP <code>")`` carrying the start of the body as detail."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HttpError("bad url", f"{parts.scheme}://{parts.hostname or ''} is not an http(s) URL")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    start = time.monotonic()
    per_op = max(min(deadline_s, 30.0), 0.05)
    if parts.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, parts.port, timeout=per_op, context=ssl_context or ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=per_op)
    result: dict[str, object] = {}

    def work() -> None:
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            result["resp"] = Response(resp.status, resp.read())
        except BaseException as e:  # reported to the caller below
            result["error"] = e

    helper = threading.Thread(target=work, name="x1-http", daemon=True)
    helper.start()
    helper.join(max(deadline_s - (time.monotonic() - start), 0.0))
    if helper.is_alive():
        _abort(conn)
        helper.join(1.0)
        raise HttpError("timeout", f"no complete answer within {deadline_s:g} s")
    conn.close()
    if "error" in result:
        e = result["error"]
        if isinstance(e, (TimeoutError, socket.timeout)):
            raise HttpError("timeout", f"no answer within {deadline_s:g} s")
        raise HttpError("network error", f"{type(e).__name__}: {e}"[:300])
    resp = result["resp"]
    assert isinstance(resp, Response)
    if not 200 <= resp.status < 300:
        raise HttpError(f"HTTP {resp.status}", resp.body[:200].decode("utf-8", "replace").strip(), resp.status)
    return resp


def _abort(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    conn.close()
