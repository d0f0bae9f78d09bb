"""The billing providers, one module each, and the one registry of them (``APIS``): Lambda Cloud's REST API,
RunPod's GraphQL API, and a fixed-rate clock. Adding a provider is one module (an ``Api`` with its read and
terminate calls, ``base.py`` for what they share) and one entry in ``APIS``: the sidecar's ``--provider``, the
watchdog's ``--terminate-on-exit`` and their flags follow it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import lambda_cloud, runpod
from .base import Api, BillingReading, PollError, SelectionError, redact

APIS: dict[str, Api] = {a.name: a for a in (lambda_cloud.API, runpod.API)}
CLOCK = "clock"  # no API: a fixed rate given on the command line
PROVIDERS = (*APIS, CLOCK)

__all__ = ["APIS", "CLOCK", "PROVIDERS", "Api", "ApiSource", "BillingReading", "ClockSource", "NodesSource"]
__all__ += ["PollError", "SelectionError"]


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
        api = APIS[self.provider]
        try:
            reading = api.read(self.base_url.rstrip("/"), self.key, self.timeout_s, self.resource_id)
        except PollError as e:
            self._explain(e)
            raise
        except SelectionError:
            raise
        except Exception as e:  # a bug or a surprise must not end the polling, nor show the key
            raise PollError("unexpected error", redact(f"{type(e).__name__}: {e}", self.key)[:200]) from None
        self.resource_id = reading.resource_id
        return reading

    def _explain(self, e: PollError) -> None:
        if e.kind in ("HTTP 401", "HTTP 403"):
            e.detail += f" (check the key in ${self.key_env})"
        e.detail = redact(e.detail, self.key)

    def terminate(self) -> str:
        """Ask the provider to terminate the followed instance/pod; returns its answer in one line."""
        if self.resource_id is None:
            self.read()  # learn which one (the only running one, or the pinned id)
        try:
            return APIS[self.provider].terminate(
                self.base_url.rstrip("/"), self.key, self.timeout_s, str(self.resource_id)
            )
        except PollError as e:
            self._explain(e)
            raise


@dataclass(frozen=True)
class ClockSource:
    rate_usd_per_hr: float
    provider: str = CLOCK

    def read(self) -> BillingReading:
        return BillingReading(self.rate_usd_per_hr, None, CLOCK)


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
