"""Alert channels from the environment (Slack webhook, SMTP email) and the Alerter that sends to all of
them without ever raising; the variables are listed in ``alerts.py`` (the ``alerts test`` command)."""

from __future__ import annotations

import base64
import json
import logging
import os
import smtplib
import ssl
import threading
import urllib.error
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Protocol
from urllib.parse import urlsplit

from ..core.http import HttpError, request

_log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
TEST_PREFIX = "[x1 TEST] "
PREFIX = "[x1] "
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every non-empty secret replaced by ``***``."""
    for s in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def _short_error(e: BaseException, secrets: Sequence[str]) -> str:
    if isinstance(e, HttpError):
        msg = str(e)
    elif isinstance(e, urllib.error.HTTPError):
        try:
            detail = e.read(200).decode("utf-8", "replace").strip()
        except Exception:  # the body is a courtesy; its absence is not an error
            detail = ""
        msg = f"HTTP {e.code} {detail}".strip()
    elif isinstance(e, urllib.error.URLError):
        msg = f"{type(e.reason).__name__}: {e.reason}"
    else:
        msg = f"{type(e).__name__}: {e}"
    return redact(msg, secrets)[:300]


class Channel(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def problem(self) -> str | None: ...  # a configuration error, reported instead of sending
    @property
    def where(self) -> str: ...  # safe to show: no secret in it

    def deliver(self, subject: str, body: str) -> None: ...
    def secrets(self) -> list[str]: ...


@dataclass(frozen=True)
class SlackChannel:
    """A Slack incoming webhook. The URL's path is the credential; only its host is ever shown."""

    url: str
    timeout_s: float = TIMEOUT_S
    problem: str | None = None
    name: str = "slack"

    @property
    def where(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"

    def secrets(self) -> list[str]:
        parts = urlsplit(self.url)
        return [s for s in (self.url, parts.path, parts.query, parts.netloc.rpartition("@")[0]) if len(s) > 1]

    def deliver(self, subject: str, body: str) -> None:
        data = json.dumps({"text": f"*{subject}*\n{body}"}).encode()
        request(self.url, self.timeout_s, "POST", {"Content-Type": "application/json"}, data)


@dataclass(frozen=True)
class SmtpChannel:
    """Email over SMTP, STARTTLS unless turned off; login only when a user is set."""

    host: str
    port: int = 587
    starttls: bool = True
    user: str | None = None
    password: str | None = None
    sender: str = "x1-pretrain@localhost"
    recipients: tuple[str, ...] = ()
    ca_file: str | None = None
    timeout_s: float = TIMEOUT_S
    problem: str | None = None
    name: str = "email"

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"

    def secrets(self) -> list[str]:
        if not self.password:
            return []
        plain = f"\0{self.user or ''}\0{self.password}".encode()
        return [self.password, base64.b64encode(plain).decode(), base64.b64encode(self.password.encode()).decode()]

    def deliver(self, subject: str, body: str) -> None:
        msg = EmailMessage()
        msg["Subject"] = subject
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.recipients)
        msg.set_content(body)
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
            if self.starttls:
                smtp.starttls(context=ssl.create_default_context(cafile=self.ca_file))
            if self.user:
                smtp.login(self.user, self.password or "")
            smtp.send_message(msg)


@dataclass
class Alerter:
    """Sends one message to every configured channel; see the module docstring."""

    configured: Sequence[Channel] = ()

    def channels(self) -> list[str]:
        return [c.name for c in self.configured]

    def send(self, subject: str, body: str, test: bool = False) -> dict[str, str | None]:
        prefix = TEST_PREFIX if test else PREFIX
        if test:
            body = "This is a TEST alert from x1_pretrain; no action is needed.\n\n" + body
        results: dict[str, str | None] = {}
        for ch in self.configured:
            error: str | None = None
            if ch.problem is not None:
                error = f"not configured: {ch.problem}"
            else:
                try:
                    ch.deliver(prefix + subject, body)
                except Exception as e:  # a failing channel must never stop the run
                    error = _short_error(e, ch.secrets())
            results[ch.name] = error
            if error is not None:
                _log.warning(f"{ch.name} ({ch.where}) failed: {error}")
        return results

    def send_within(self, subject: str, body: str, deadline_s: float = 20.0) -> dict[str, str | None]:
        """``send`` on a helper thread, waiting at most ``deadline_s`` (for paths that must exit soon)."""
        results: dict[str, str | None] = {}
        helper = threading.Thread(target=lambda: results.update(self.send(subject, body)), daemon=True, name="x1-alert")
        helper.start()
        helper.join(deadline_s)
        if helper.is_alive():
            _log.warning(f"not every channel answered within {deadline_s:g} s")
        return results


def _slack_from_env(env: Mapping[str, str]) -> SlackChannel | None:
    url = env.get("X1_SLACK_WEBHOOK_URL", "").strip()
    if not url:
        return None
    parts = urlsplit(url)
    problem = None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        problem = "X1_SLACK_WEBHOOK_URL is not an http(s) URL; set it to the webhook URL Slack gave you"
    return SlackChannel(url=url, problem=problem)


def _smtp_from_env(env: Mapping[str, str]) -> SmtpChannel | None:
    host = env.get("X1_SMTP_HOST", "").strip()
    if not host:
        return None
    problems: list[str] = []
    port_text = env.get("X1_SMTP_PORT", "").strip() or "587"
    port = 587
    if port_text.isdigit() and 0 < int(port_text) < 65536:
        port = int(port_text)
    else:
        problems.append(f"X1_SMTP_PORT={port_text!r} is not a port number (e.g. 587)")
    tls_text = env.get("X1_SMTP_STARTTLS", "").strip().lower() or "true"
    if tls_text not in _TRUE | _FALSE:
        problems.append(f"X1_SMTP_STARTTLS={tls_text!r}: use true or false")
    user = env.get("X1_SMTP_USER", "").strip() or None
    recipients = tuple(a.strip() for a in env.get("X1_SMTP_TO", "").split(",") if a.strip())
    if not recipients:
        problems.append("X1_SMTP_TO is not set; set it to one or more comma-separated addresses")
    return SmtpChannel(
        host=host,
        port=port,
        starttls=tls_text not in _FALSE,
        user=user,
        password=env.get("X1_SMTP_PASSWORD") or None,
        sender=env.get("X1_SMTP_FROM", "").strip() or user or "x1-pretrain@localhost",
        recipients=recipients,
        ca_file=env.get("X1_SMTP_CA_FILE", "").strip() or None,
        problem="; ".join(problems) or None,
    )


def from_env(environ: Mapping[str, str] = os.environ) -> Alerter:
    """An Alerter with a channel for each service the environment configures (possibly none)."""
    found = [_slack_from_env(environ), _smtp_from_env(environ)]
    return Alerter([c for c in found if c is not None])
