"""RunPod's GraphQL API: the followed pod's price, uptime and the account's balance, and its terminate call."""

from __future__ import annotations

from typing import Any

from .base import Api, BillingReading, PollError, field, number, request_json, select

RUNPOD_QUERY = "query { myself { clientBalance pods { id name costPerHr desiredStatus runtime { uptimeInSeconds } } } }"


def parse_runpod(payload: Any, pod_id: str | None = None) -> BillingReading:
    """RunPod's GraphQL ``myself { pods … }`` answer → the followed pod's rate and uptime."""
    if isinstance(payload, dict) and payload.get("errors"):
        errors = payload["errors"]
        first = errors[0] if isinstance(errors, list) and errors else errors
        message = first.get("message", first) if isinstance(first, dict) else first
        raise PollError("API error", str(message)[:200])
    myself = field(field(payload, "data", "body"), "myself", "body.data")
    balance = myself.get("clientBalance") if isinstance(myself, dict) else None
    pods = field(myself, "pods", "body.data.myself")
    if not isinstance(pods, list):
        raise PollError("bad field", "body.data.myself.pods is not a list")
    items = []
    for i, pod in enumerate(pods):
        rid = str(field(pod, "id", f"pods[{i}]"))
        items.append((rid, isinstance(pod, dict) and pod.get("desiredStatus") == "RUNNING", (i, pod)))
    rid, (i, pod) = select(items, pod_id, "pod", "--pod-id")
    rate = number(field(pod, "costPerHr", f"pods[{i}]"), f"pods[{i}].costPerHr")
    runtime = pod.get("runtime")
    uptime = None
    if isinstance(runtime, dict) and runtime.get("uptimeInSeconds") is not None:
        uptime = number(runtime["uptimeInSeconds"], f"pods[{i}].runtime.uptimeInSeconds")
    money = number(balance, "myself.clientBalance") if isinstance(balance, (int, float)) and balance >= 0 else None
    return BillingReading(rate_usd_per_hr=rate, uptime_s=uptime, resource_id=rid, balance_usd=money)


def read(base: str, key: str, timeout_s: float, pod_id: str | None) -> BillingReading:
    return parse_runpod(request_json(f"{base}/graphql", key, timeout_s, {"query": RUNPOD_QUERY}), pod_id)


def terminate(base: str, key: str, timeout_s: float, pod_id: str) -> str:
    answer = request_json(
        f"{base}/graphql", key, timeout_s, {"query": f'mutation {{ podTerminate(input: {{podId: "{pod_id}"}}) }}'}
    )
    if isinstance(answer, dict) and answer.get("errors"):
        raise PollError("API error", str(answer["errors"])[:200])
    return f"RunPod terminated pod {pod_id}"


API = Api(
    name="runpod",
    title="RunPod",
    base_url="https://api.runpod.io",
    key_env="RUNPOD_API_KEY",
    noun="pod",
    id_flag="--pod-id",
    id_env="RUNPOD_POD_ID",
    read=read,
    terminate=terminate,
)
