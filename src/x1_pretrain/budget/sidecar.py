"""Billing readings → budget.json: the Lambda, RunPod and clock sources and the polling Sidecar. The
command, its flags and the file's contract are documented in ``budget_sidecar.py``."""

from __future__ import annotations

import http.client
import json
import math
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ..core.errors import EXIT_OK, X1Error
from ..core.fileio import write_text_atomic

PROVIDERS = ("lambda", "runpod", "clock")
DEFAULT_BASE_URL = {"lambda": "https://cloud.lambdalabs.com", "runpod": "https://api.runpod.io"}
DEFAULT_KEY_ENV = {"lambda": "LAMBDA_API_KEY", "runpod": "RUNPOD_API_KEY"}
LAMBDA_RUNNING = {"active", "booting", "unhealthy"}  # states Lambda bills for
RUNPOD_QUERY = "query { myself { pods { id name costPerHr desiredStatus runtime { uptimeInSeconds } } } }"
USER_AGENT = "x1-pretrain-budget-sidecar/0.1"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


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
class Reading:
    """What one poll learned: the hourly rate, the provider's uptime if it reports one, and what was read."""

    rate_usd_per_hr: float
    uptime_s: float | None
    resource_id: str


# --- pure parts ---------------------------------------------------------------------------------------
def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or obj.get(key) is None:
        raise PollError("missing field", f"{where}.{key}")
    return obj[key]


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PollError("bad field", f"{where} = {value!r} is not a non-negative number")
    return float(value)


def _select(items: list[tuple[str, bool, Any]], wanted: str | None, noun: str, flag: str) -> tuple[str, Any]:
    """Pick (id, item) from (id, running, item) by ``wanted`` id, else the only running one."""
    if wanted is not None:
        for rid, _, item in items:
            if rid == wanted:
                return rid, item
        known = ", ".join(rid for rid, _, _ in items) or "none"
        raise SelectionError(f"{flag} {wanted}: no such {noun} in this account (found: {known}). "
                             f"Check the id in the provider's dashboard.")
    running = [(rid, item) for rid, up, item in items if up]
    if len(running) == 1:
        return running[0]
    if not running:
        raise SelectionError(f"no running {noun} in this account: launch one first, or pass {flag} ID "
                             f"(or use --provider clock --rate-usd-per-hr R).")
    ids = ", ".join(rid for rid, _ in running)
    raise SelectionError(f"{len(running)} running {noun}s ({ids}): pass {flag} ID to say which one to follow.")


def parse_lambda(payload: Any, instance_id: str | None = None) -> Reading:
    """Lambda's ``GET /api/v1/instances`` answer → the followed instance's rate (no uptime in this API)."""
    data = _field(payload, "data", "body")
    if not isinstance(data, list):
        raise PollError("bad field", "body.data is not a list")
    items = []
    for i, inst in enumerate(data):
        rid = str(_field(inst, "id", f"data[{i}]"))
        items.append((rid, _field(inst, "status", f"data[{i}]") in LAMBDA_RUNNING, (i, inst)))
    rid, (i, inst) = _select(items, instance_id, "instance", "--instance-id")
    itype = _field(inst, "instance_type", f"data[{i}]")
    cents = _number(_field(itype, "price_cents_per_hour", f"data[{i}].instance_type"),
                    f"data[{i}].instance_type.price_cents_per_hour")
    return Reading(rate_usd_per_hr=cents / 100.0, uptime_s=None, resource_id=rid)


def parse_runpod(payload: Any, pod_id: str | None = None) -> Reading:
    """RunPod's GraphQL ``myself { pods … }`` answer → the followed pod's rate and uptime."""
    if isinstance(payload, dict) and payload.get("errors"):
        errors = payload["errors"]
        first = errors[0] if isinstance(errors, list) and errors else errors
        message = first.get("message", first) if isinstance(first, dict) else first
        raise PollError("API error", str(message)[:200])
    myself = _field(_field(payload, "data", "body"), "myself", "body.data")
    pods = _field(myself, "pods", "body.data.myself")
    if not isinstance(pods, list):
        raise PollError("bad field", "body.data.myself.pods is not a list")
    items = []
    for i, pod in enumerate(pods):
        rid = str(_field(pod, "id", f"pods[{i}]"))
        items.append((rid, isinstance(pod, dict) and pod.get("desiredStatus") == "RUNNING", (i, pod)))
    rid, (i, pod) = _select(items, pod_id, "pod", "--pod-id")
    rate = _number(_field(pod, "costPerHr", f"pods[{i}]"), f"pods[{i}].costPerHr")
    runtime = pod.get("runtime")
    uptime = None
    if isinstance(runtime, dict) and runtime.get("uptimeInSeconds") is not None:
        uptime = _number(runtime["uptimeInSeconds"], f"pods[{i}].runtime.uptimeInSeconds")
    return Reading(rate_usd_per_hr=rate, uptime_s=uptime, resource_id=rid)


def format_utc(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime(TIME_FORMAT)


def parse_utc(text: str) -> datetime:
    """ISO 8601 → aware UTC datetime; a time without an offset is taken as UTC."""
    t = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def build_budget(reading: Reading, *, now: datetime, started: datetime, planned_hours: float,
                 provider: str) -> dict[str, Any]:
    """The budget.json contents for one reading (hours from the provider's uptime if any, else the start)."""
    if reading.uptime_s is not None:
        hours = reading.uptime_s / 3600.0
    else:
        hours = max(0.0, (now - started).total_seconds() / 3600.0)
    rate = reading.rate_usd_per_hr
    spent = rate * hours
    projected = spent + rate * max(0.0, planned_hours - hours)
    return {
        "spent_usd": round(spent, 4),
        "rate_usd_per_hr": round(rate, 6),
        "hours_elapsed": round(hours, 4),
        "projected_total_usd": round(projected, 4),
        "last_update_utc": format_utc(now),
        "provider": provider,
        "resource_id": reading.resource_id,
        "started_utc": format_utc(started),
        "planned_hours": planned_hours,
    }


# --- edges: HTTP, files, clock ------------------------------------------------------------------------
def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


def request_json(url: str, key: str, timeout_s: float, body: dict[str, Any] | None = None) -> Any:
    """One authenticated JSON request. Every failure is a PollError whose text never holds the key."""
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json", "User-Agent": USER_AGENT}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise PollError(f"HTTP {e.code}", _redact(str(e.reason), key)[:200]) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise PollError("timeout", f"no answer within {timeout_s:g} s") from None
        raise PollError("network error", _redact(str(e.reason), key)[:200]) from None
    except TimeoutError:
        raise PollError("timeout", f"no answer within {timeout_s:g} s") from None
    except (OSError, ValueError, http.client.HTTPException) as e:  # a reset, a cut-off body, a bad header
        raise PollError("network error", _redact(f"{type(e).__name__}: {e}", key)[:200]) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise PollError("malformed JSON", f"{len(raw)} bytes that are not JSON") from None


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write to a temporary name in the same directory, fsync, rename into place."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class ApiSource:
    """A billing API: fetches and parses one reading, then follows the same instance/pod from then on."""

    provider: str
    base_url: str
    key: str
    key_env: str
    timeout_s: float
    resource_id: str | None = None

    def read(self) -> Reading:
        base = self.base_url.rstrip("/")
        try:
            if self.provider == "lambda":
                reading = parse_lambda(request_json(f"{base}/api/v1/instances", self.key, self.timeout_s),
                                       self.resource_id)
            else:
                reading = parse_runpod(request_json(f"{base}/graphql", self.key, self.timeout_s,
                                                    {"query": RUNPOD_QUERY}), self.resource_id)
        except PollError as e:
            if e.kind in ("HTTP 401", "HTTP 403"):
                e.detail += f" (check the key in ${self.key_env})"
            e.detail = _redact(e.detail, self.key)
            raise
        except SelectionError:
            raise
        except Exception as e:  # a bug or a surprise must not end the polling, nor show the key
            raise PollError("unexpected error", _redact(f"{type(e).__name__}: {e}", self.key)[:200]) from None
        self.resource_id = reading.resource_id
        return reading


@dataclass(frozen=True)
class ClockSource:
    rate_usd_per_hr: float
    provider: str = "clock"

    def read(self) -> Reading:
        return Reading(self.rate_usd_per_hr, None, "clock")


@dataclass
class Sidecar:
    """Polls a source and rewrites budget.json after every good poll; leaves it alone after a bad one."""

    source: ApiSource | ClockSource
    out: Path
    started: datetime
    planned_hours: float
    now: Callable[[], datetime] = utc_now
    log: TextIO | None = None  # None: sys.stderr at the time of the call
    polled_ok: bool = False

    def _say(self, line: str) -> None:
        print(f"[budget_sidecar] {line}", file=self.log or sys.stderr, flush=True)

    def poll(self) -> bool:
        """One poll. True when budget.json was rewritten. SelectionError escapes only before the first success."""
        name = self.source.provider
        try:
            reading = self.source.read()
            budget = build_budget(reading, now=self.now(), started=self.started,
                                  planned_hours=self.planned_hours, provider=name)
            write_json_atomic(self.out, budget)
        except PollError as e:
            self._say(f"{name}: {e.kind}{': ' + e.detail if e.detail else ''}; budget.json left as it was")
            return False
        except SelectionError as e:
            if not self.polled_ok:
                raise
            self._say(f"{name}: {e}; budget.json left as it was")
            return False
        except OSError as e:
            self._say(f"{name}: cannot write {self.out}: {e.strerror or e}; will retry")
            return False
        self.polled_ok = True
        what = name if reading.resource_id == name else f"{name} {reading.resource_id}"
        self._say(f"{what}: spent ${budget['spent_usd']:.2f} at "
                  f"${budget['rate_usd_per_hr']:.2f}/h over {budget['hours_elapsed']:.2f} h, "
                  f"projected ${budget['projected_total_usd']:.2f}")
        return True

    def run(self, interval_s: float, stop: threading.Event) -> int:
        """Poll, then wait ``interval_s``, until ``stop`` is set (by SIGTERM/SIGINT in main)."""
        while not stop.is_set():
            self.poll()
            stop.wait(interval_s)
        self._say("stopped")
        return EXIT_OK


# --- CLI ----------------------------------------------------------------------------------------------
def resolve_start(out: Path, flag: str | None, now: datetime) -> tuple[datetime, str]:
    """The start time and where it came from; records it in OUT.start so a restart keeps it."""
    state = Path(f"{out}.start")
    if flag is not None:
        try:
            started = parse_utc(flag)
        except ValueError:
            raise X1Error(f"--started-utc {flag!r} is not an ISO time; use e.g. 2026-05-23T03:00:00Z") from None
        origin = "--started-utc"
    elif state.exists():
        try:
            started = parse_utc(json.loads(state.read_text())["started_utc"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise X1Error(f"{state} is unreadable; delete it to start counting now, "
                          f"or pass --started-utc TIME") from None
        return started, str(state)
    else:
        started, origin = now, f"first start, recorded in {state}"
    write_json_atomic(state, {"started_utc": format_utc(started)})
    return started, origin
