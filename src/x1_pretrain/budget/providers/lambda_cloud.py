"""Lambda Cloud's REST API: the followed instance's price (``GET /api/v1/instances``; no uptime in this API)
and its terminate call."""

from __future__ import annotations

import json
from typing import Any

from .base import Api, BillingReading, PollError, field, number, request_json, select

LAMBDA_RUNNING = {"active", "booting", "unhealthy"}  # states Lambda bills for


def parse_lambda(payload: Any, instance_id: str | None = None) -> BillingReading:
    """Lambda's ``GET /api/v1/instances`` answer → the followed instance's rate (no uptime in this API)."""
    data = field(payload, "data", "body")
    if not isinstance(data, list):
        raise PollError("bad field", "body.data is not a list")
    items = []
    for i, inst in enumerate(data):
        rid = str(field(inst, "id", f"data[{i}]"))
        items.append((rid, field(inst, "status", f"data[{i}]") in LAMBDA_RUNNING, (i, inst)))
    rid, (i, inst) = select(items, instance_id, "instance", "--instance-id")
    itype = field(inst, "instance_type", f"data[{i}]")
    cents = number(
        field(itype, "price_cents_per_hour", f"data[{i}].instance_type"),
        f"data[{i}].instance_type.price_cents_per_hour",
    )
    return BillingReading(rate_usd_per_hr=cents / 100.0, uptime_s=None, resource_id=rid)


def read(base: str, key: str, timeout_s: float, instance_id: str | None) -> BillingReading:
    return parse_lambda(request_json(f"{base}/api/v1/instances", key, timeout_s), instance_id)


def terminate(base: str, key: str, timeout_s: float, instance_id: str) -> str:
    answer = request_json(
        f"{base}/api/v1/instance-operations/terminate", key, timeout_s, {"instance_ids": [instance_id]}
    )
    done = [i.get("id") for i in (answer.get("data") or {}).get("terminated_instances", []) if isinstance(i, dict)]
    if instance_id not in done:
        raise PollError("not terminated", f"Lambda answered {json.dumps(answer)[:200]}")
    return f"Lambda terminated instance {instance_id}"


API = Api(
    name="lambda",
    title="Lambda",
    base_url="https://cloud.lambdalabs.com",
    key_env="LAMBDA_API_KEY",
    noun="instance",
    id_flag="--instance-id",
    id_env=None,
    read=read,
    terminate=terminate,
)
