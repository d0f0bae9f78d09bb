"""What every billing API shares: a reading, the errors (a :class:`PollError`'s text never holds the key), the
checks on a provider's answer, the choice of the instance or pod to follow, one authenticated JSON request
with a total deadline (``core.http``), and ``Api``, the record a provider module fills in."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.errors import X1Error
from ...core.http import HttpError, request

USER_AGENT = "x1-pretrain-budget-sidecar/0.2"


class PollError(Exception):
    """One failed poll: ``kind`` is short and fixed (``timeout``, ``HTTP 401``, ``malformed JSON`` …)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(kind)
        self.kind = kind
        self.detail = detail

    def __str__(self) -> str:  # from the fields, so redacting ``detail`` redacts the message too
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


class SelectionError(X1Error):
    """Which instance or pod to follow is unclear: fatal before the first good poll, logged after."""


@dataclass(frozen=True)
class BillingReading:
    """What one poll learned: the hourly rate, the provider's uptime and account balance if it reports them,
    and which instance or pod was read."""

    rate_usd_per_hr: float
    uptime_s: float | None
    resource_id: str
    balance_usd: float | None = None


# --- pure parts ---------------------------------------------------------------------------------------
def field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or obj.get(key) is None:
        raise PollError("missing field", f"{where}.{key}")
    return obj[key]


def number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PollError("bad field", f"{where} = {value!r} is not a non-negative number")
    return float(value)


def select(items: list[tuple[str, bool, Any]], wanted: str | None, noun: str, flag: str) -> tuple[str, Any]:
    """Pick (id, item) from (id, running, item) by ``wanted`` id, else the only running one."""
    if wanted is not None:
        for rid, _, item in items:
            if rid == wanted:
                return rid, item
        known = ", ".join(rid for rid, _, _ in items) or "none"
        raise SelectionError(
            f"{flag} {wanted}: no such {noun} in this account (found: {known}). "
            f"Check the id in the provider's dashboard."
        )
    running = [(rid, item) for rid, up, item in items if up]
    if len(running) == 1:
        return running[0]
    if not running:
        raise SelectionError(
            f"no running {noun} in this account: launch one first, or pass {flag} ID "
            f"(or use --provider clock --rate-usd-per-hr R)."
        )
    ids = ", ".join(rid for rid, _ in running)
    raise SelectionError(f"{len(running)} running {noun}s ({ids}): pass {flag} ID to say which one to follow.")


def redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def request_json(url: str, key: str, timeout_s: float, body: dict[str, Any] | None = None) -> Any:
    """One authenticated JSON request, all of it within ``timeout_s`` (a server that drips its answer is cut
    off at the deadline). Every failure is a PollError whose text never holds the key."""
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json", "User-Agent": USER_AGENT}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        raw = request(url, timeout_s, "POST" if body is not None else "GET", headers, data).body
    except HttpError as e:
        raise PollError(e.kind, redact(e.detail, key)[:200]) from None
    except (ValueError, UnicodeError) as e:  # a key that cannot go in a header
        raise PollError("bad request", redact(f"{type(e).__name__}: {e}", key)[:200]) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise PollError("malformed JSON", f"{len(raw)} bytes that are not JSON") from None


@dataclass(frozen=True, kw_only=True)
class Api:
    """One billing API, as its module describes it: the name ``--provider`` and ``--terminate-on-exit`` take,
    its default base URL and key variable, the flag (and variable) naming the instance or pod to follow, and
    its two calls: ``read(base_url, key, timeout_s, resource_id) -> BillingReading`` and ``terminate(base_url,
    key, timeout_s, resource_id) -> str`` (the provider's answer in one line; PollError when it did not)."""

    name: str
    title: str  # as people write it: "Lambda", "RunPod"
    base_url: str
    key_env: str
    noun: str  # what it bills: "instance", "pod"
    id_flag: str  # the flag naming the one to follow: --instance-id, --pod-id
    id_env: str | None  # a variable the machine itself sets with that id (RunPod's RUNPOD_POD_ID)
    read: Callable[[str, str, float, str | None], BillingReading]
    terminate: Callable[[str, str, float, str], str]

    @property
    def id_dest(self) -> str:
        """The argparse destination of ``id_flag``."""
        return self.id_flag.removeprefix("--").replace("-", "_")

    def id_help(self, where: str = "") -> str:
        return f"{self.title} {self.noun} to follow (default: {where}the only running one)"
