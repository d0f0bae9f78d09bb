"""Shared by the budget tests: a real HTTP server standing in for Slack, and budget.json as the sidecar writes it."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


class Webhook:
    """A real HTTP server on 127.0.0.1 recording the JSON bodies posted to it."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts.append(json.loads(body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/secret-token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def webhook(monkeypatch):
    hook = Webhook()
    monkeypatch.setenv("X1_SLACK_WEBHOOK_URL", hook.url)
    for k in ("X1_SMTP_HOST", "X1_SMTP_TO"):
        monkeypatch.delenv(k, raising=False)
    yield hook
    hook.close()


def write_budget(path: Path, spent: float, projected: float, rate: float = 1.10, when: datetime | None = None):
    """A budget.json as the sidecar writes it; spent_usd is the whole bill (fixed_usd says what it carries)."""
    when = when or datetime.now(timezone.utc)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "spent_usd": spent,
                "rate_usd_per_hr": rate,
                "hours_elapsed": spent / rate,
                "projected_total_usd": projected,
                "fixed_usd": {"disk_usd": 0.0, "egress_usd": 0.0},
                "last_update_utc": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )
    tmp.replace(path)
