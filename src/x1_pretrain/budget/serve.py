"""budget.json for the other nodes of a cluster: one file over HTTP, only to a request that carries the
cluster's bearer token (``Authorization: Bearer <token>``, compared in constant time).

Nothing else is served (no listing, no other path); the file is read again for every request, so the sidecar's
atomic rewrites are seen at once. The token comes from ``$X1_BUDGET_TOKEN``, a file (``$X1_BUDGET_TOKEN_FILE``
or the command's ``--token-file``), or on a SkyPilot cluster from :func:`derive_token`: every node holds the
same task secrets, so every node computes the same token without it ever crossing the network.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..core.errors import X1Error

_log = logging.getLogger(__name__)

TOKEN_ENV, TOKEN_FILE_ENV = "X1_BUDGET_TOKEN", "X1_BUDGET_TOKEN_FILE"
MIN_TOKEN_CHARS = 16
# the task secrets a SkyPilot recipe passes to every node (any of them keys the derived token)
SHARED_SECRETS = ("LAMBDA_API_KEY", "RUNPOD_API_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "X1_SLACK_WEBHOOK_URL")


def token_from_env(environ: Mapping[str, str] = os.environ, token_file: Path | None = None) -> str | None:
    """The bearer token: ``token_file``, ``$X1_BUDGET_TOKEN``, then ``$X1_BUDGET_TOKEN_FILE``; None when none
    is set. An unreadable file is an :class:`X1Error` naming it."""
    path = token_file or (Path(environ[TOKEN_FILE_ENV]) if environ.get(TOKEN_FILE_ENV) else None)
    if token_file is None and environ.get(TOKEN_ENV, "").strip():
        return environ[TOKEN_ENV].strip()
    if path is None:
        return None
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError) as e:
        where = "--token-file" if token_file else TOKEN_FILE_ENV
        raise X1Error(
            f"{where} {path} cannot be read ({type(e).__name__}); write the budget token into it (one line)"
        ) from None


def derive_token(environ: Mapping[str, str] = os.environ) -> str:
    """A token every node of one SkyPilot task computes alike: HMAC-SHA256 keyed by the task's secrets, over
    the task id. Without any secret there is nothing a stranger lacks: an :class:`X1Error` with the fix."""
    key = "\0".join(environ.get(name, "") for name in SHARED_SECRETS)
    if not key.strip("\0"):
        raise X1Error(
            f"no secret to derive the budget token from (none of {', '.join(SHARED_SECRETS)} is set); "
            f"pass one to every node: --secret {TOKEN_ENV}=$(openssl rand -hex 32)"
        )
    task = environ.get("SKYPILOT_TASK_ID", "")
    return hmac.new(key.encode(), f"x1-budget-token|{task}".encode(), hashlib.sha256).hexdigest()


def check_token(token: str | None) -> str:
    if not token or len(token) < MIN_TOKEN_CHARS:
        raise X1Error(
            f"the budget token must be at least {MIN_TOKEN_CHARS} characters (set {TOKEN_ENV} or "
            f"--token-file; e.g. openssl rand -hex 32)"
        )
    return token


def authorized(header: str | None, token: str) -> bool:
    """``header`` is ``Bearer <token>`` (constant time in the token's bytes)."""
    return hmac.compare_digest((header or "").encode(), f"Bearer {token}".encode())


class BudgetServer:
    """Serves ``path`` at ``/<its name>`` on ``bind:port`` (port 0: any free one) to holders of ``token``."""

    def __init__(self, path: Path, token: str, bind: str, port: int) -> None:
        self.path, self.token = path, check_token(token)
        handler = _handler(self)
        try:
            self.httpd = ThreadingHTTPServer((bind, port), handler)
        except OSError as e:
            raise X1Error(
                f"--bind {bind} --port {port}: cannot listen there ({e.strerror}); give this machine's "
                "private address and a free port"
            ) from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/{self.path.name}"

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def start(self) -> BudgetServer:
        """Serve on a thread (tests, or a caller with work of its own)."""
        self._thread = threading.Thread(target=self.serve_forever, name="x1-budget-serve", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: BudgetServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            if not authorized(self.headers.get("Authorization"), server.token):
                return self._send(
                    401,
                    b'{"error": "a bearer token is required"}\n',
                    body,
                    {"WWW-Authenticate": 'Bearer realm="x1-budget"'},
                )
            if self.path.split("?", 1)[0] != f"/{server.path.name}":
                return self._send(404, b'{"error": "only the budget file is served here"}\n', body)
            try:
                data = server.path.read_bytes()
            except OSError:
                return self._send(503, b'{"error": "no budget file yet (is the billing sidecar running?)"}\n', body)
            self._send(200, data, body)

        def _send(self, code: int, data: bytes, body: bool, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for name, value in {
                "Content-Type": "application/json",
                "Cache-Control": "no-store",
                "Content-Length": str(len(data)),
                **(extra or {}),
            }.items():
                self.send_header(name, value)
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            # the request line and the code; never a header (the token)
            _log.info(f"{self.client_address[0]} {format % args}")

    return Handler
