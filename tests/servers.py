"""Real HTTP servers on 127.0.0.1 for the tests: a JSON API that records requests (standing in for Slack,
Lambda, RunPod or a budget source), and a server that answers one byte at a time."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonServer:
    """Answers each path with a JSON body (or a callable of the request body); records every request."""

    def __init__(self) -> None:
        self.routes: dict[str, Any] = {}
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                outer.requests.append((self.command, self.path, dict(self.headers), body))
                route = outer.routes.get(self.path.split("?")[0], (404, {"error": "not found"}))
                status, payload = route(body) if callable(route) else route
                raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _answer

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def route(self, path: str, payload: Any, status: int = 200) -> None:
        self.routes[path] = payload if callable(payload) else (status, payload)

    def bodies(self, path: str) -> list[Any]:
        return [json.loads(b) if b else None for _, p, _, b in self.requests if p.split("?")[0] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Listener:
    """A raw TCP listener on 127.0.0.1 that hands each connection to ``_handle`` on its own thread."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()


class DripServer(_Listener):
    """Accepts a connection and sends a valid HTTP answer one byte every ``every_s`` seconds."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.every_s = every_s
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/budget.json"

    def _handle(self, conn: socket.socket) -> None:
        try:
            conn.recv(4096)
            for ch in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
                conn.send(bytes([ch]))
                time.sleep(self.every_s)
        except OSError:
            pass
        finally:
            conn.close()


class SilentServer(_Listener):
    """Accepts connections, reads the requests and never answers (a wedged tracking server)."""

    def __init__(self) -> None:
        self.connections: list[socket.socket] = []
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def _handle(self, conn: socket.socket) -> None:
        self.connections.append(conn)  # kept open, never written to

    def close(self) -> None:
        super().close()
        for c in self.connections:
            c.close()


def wait_until(pred: Callable[[], bool], timeout: float = 60.0, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return False
