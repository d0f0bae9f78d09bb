"""The billing providers: Lambda's REST API, RunPod's GraphQL API and a fixed-rate clock, each read with a
total deadline (``core.http``) and with every failure a :class:`PollError` whose text never holds the key;
and the providers' terminate calls (``--terminate-on-exit``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..core.errors import X1Error
from ..core.http import HttpError, request

PROVIDERS = ("lambda", "runpod", "clock")
DEFAULT_BASE_URL = {"lambda": "https://cloud.lambdalabs.com", "runpod": "https://api.runpod.io"}
DEFAULT_KEY_ENV = {"lambda": "LAMBDA_API_KEY", "runpod": "RUNPOD_API_KEY"}
LAMBDA_RUNNING = {"active", "booting", "unhealthy"}  # states Lambda bills for
RUNPOD_QUERY = "query { myself { clientBalance pods { id name costPerHr desiredStatus runtime { uptimeInSeconds } } } }"
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


def parse_lambda(payload: Any, instance_id: str | None = None) -> BillingReading:
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
    cents = _number(
        _field(itype, "price_cents_per_hour", f"data[{i}].instance_type"),
        f"data[{i}].instance_type.price_cents_per_hour",
    )
    return BillingReading(rate_usd_per_hr=cents / 100.0, uptime_s=None, resource_id=rid)


def parse_runpod(payload: Any, pod_id: str | None = None) -> BillingReading:
    """RunPod's GraphQL ``myself { pods … }`` answer → the followed pod's rate and uptime."""
    if isinstance(payload, dict) and payload.get("errors"):
        errors = payload["errors"]
        first = errors[0] if isinstance(errors, list) and errors else errors
        message = first.get("message", first) if isinstance(first, dict) else first
        raise PollError("API error", str(message)[:200])
    myself = _field(_field(payload, "data", "body"), "myself", "body.data")
    balance = myself.get("clientBalance") if isinstance(myself, dict) else None
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
    money = _number(balance, "myself.clientBalance") if isinstance(balance, (int, float)) and balance >= 0 else None
    return BillingReading(rate_usd_per_hr=rate, uptime_s=uptime, resource_id=rid, balance_usd=money)


def _redact(text: str, secret: str) -> str:
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
        raise PollError(e.kind, _redact(e.detail, key)[:200]) from None
    except (ValueError, UnicodeError) as e:  # a key that cannot go in a header
        raise PollError("bad request", _redact(f"{type(e).__name__}: {e}", key)[:200]) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise PollError("malformed JSON", f"{len(raw)} bytes that are not JSON") from None


@dataclass
class ApiSource:
    """A billing API: fetches and parses one reading, then follows the same instance/pod from then on."""

    provider: str
    base_url: str
    key: str
    key_env: str
    timeout_s: float
    resource_id: str | None = None

    def read(self) -> BillingReading:
        base = self.base_url.rstrip("/")
        try:
            if self.provider == "lambda":
                reading = parse_lambda(
                    request_json(f"{base}/api/v1/instances", self.key, self.timeout_s), self.resource_id
                )
            else:
                reading = parse_runpod(
                    request_json(f"{base}/graphql", self.key, self.timeout_s, {"query": RUNPOD_QUERY}), self.resource_id
                )
        except PollError as e:
            self._explain(e)
            raise
        except SelectionError:
            raise
        except Exception as e:  # a bug or a surprise must not end the polling, nor show the key
            raise PollError("unexpected error", _redact(f"{type(e).__name__}: {e}", self.key)[:200]) from None
        self.resource_id = reading.resource_id
        return reading

    def _explain(self, e: PollError) -> None:
        if e.kind in ("HTTP 401", "HTTP 403"):
            e.detail += f" (check the key in ${self.key_env})"
        e.detail = _redact(e.detail, self.key)

    def terminate(self) -> str:
        """Ask the provider to terminate the followed instance/pod; returns its answer in one line."""
        if self.resource_id is None:
            self.read()  # learn which one (the only running one, or the pinned id)
        base, rid = self.base_url.rstrip("/"), self.resource_id
        try:
            if self.provider == "lambda":
                answer = request_json(
                    f"{base}/api/v1/instance-operations/terminate", self.key, self.timeout_s, {"instance_ids": [rid]}
                )
                done = [
                    i.get("id")
                    for i in (answer.get("data") or {}).get("terminated_instances", [])
                    if isinstance(i, dict)
                ]
                if rid not in done:
                    raise PollError("not terminated", f"Lambda answered {json.dumps(answer)[:200]}")
                return f"Lambda terminated instance {rid}"
            answer = request_json(
                f"{base}/graphql",
                self.key,
                self.timeout_s,
                {"query": f'mutation {{ podTerminate(input: {{podId: "{rid}"}}) }}'},
            )
            if isinstance(answer, dict) and answer.get("errors"):
                raise PollError("API error", str(answer["errors"])[:200])
            return f"RunPod terminated pod {rid}"
        except PollError as e:
            self._explain(e)
            raise


@dataclass(frozen=True)
class ClockSource:
    rate_usd_per_hr: float
    provider: str = "clock"

    def read(self) -> BillingReading:
        return BillingReading(self.rate_usd_per_hr, None, "clock")


@dataclass(frozen=True)
class NodesSource:
    """The bill of ``nodes`` identical machines launched together (a multi-node job), from one machine's
    reading: the rate times the node count, so the cap guards the sum. The account balance is the account's,
    left as read."""

    inner: Any
    nodes: int

    @property
    def provider(self) -> str:
        return str(self.inner.provider)

    def read(self) -> BillingReading:
        r = self.inner.read()
        return BillingReading(
            r.rate_usd_per_hr * self.nodes, r.uptime_s, f"{r.resource_id} x{self.nodes} nodes", r.balance_usd
        )
