"""Ending the bill against local fakes of Lambda's and RunPod's APIs, with a real export_run."""

from __future__ import annotations

import json

import pytest

from x1_pretrain.budget.providers import ApiSource, PollError
from x1_pretrain.budget.terminate import EndOfBill, end_the_bill

from ..run_bundle import build
from ..servers import JsonServer


class Alerts:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send_within(self, subject: str, body: str, deadline_s: float = 20.0) -> dict:
        self.sent.append((subject, body))
        return {}


@pytest.fixture
def api():
    s = JsonServer()
    s.route("/api/v1/instances", {"data": [{"id": "inst-a", "status": "active", "instance_type": {
        "name": "gpu_1x_a100", "price_cents_per_hour": 110}}]})
    s.route("/api/v1/instance-operations/terminate", lambda body: (200, {"data": {"terminated_instances": [
        {"id": i, "status": "terminating"} for i in json.loads(body)["instance_ids"]]}}))
    s.route("/graphql", lambda body: (200, {"data": {"podTerminate": None}} if "podTerminate" in body.decode()
                                      else {"data": {"myself": {"pods": [{"id": "pod-a", "costPerHr": 0.79,
                                                                          "desiredStatus": "RUNNING"}]}}}))
    yield s
    s.close()


def test_lambda_after_a_finished_run_exports_then_terminates(api, tmp_path_factory, demo_data, tmp_path):
    built = build(tmp_path_factory, demo_data)
    logs, alerts = [], Alerts()
    end = EndOfBill(ApiSource("lambda", api.base, "sk-KEY-xyz", "LAMBDA_API_KEY", 5.0), tmp_path / "bundle",
                    built.uri)
    assert end_the_bill(end, 0, logs.append, alerts)
    assert (tmp_path / "bundle" / "manifest.json").is_file() and (tmp_path / "bundle" / "final.safetensors").is_file()
    assert api.bodies("/api/v1/instance-operations/terminate") == [{"instance_ids": ["inst-a"]}]
    assert any("Lambda terminated instance inst-a" in line for line in logs)
    assert alerts.sent[-1][0] == "x1: instance terminated" and "sk-KEY-xyz" not in "".join(logs)
    # the key went in the header, nowhere else
    (_, _, headers, _), *_ = [r for r in api.requests if "terminate" in r[1]]
    assert headers["Authorization"] == "Bearer sk-KEY-xyz"


def test_runpod_terminates_the_pod_it_was_told(api, tmp_path_factory, demo_data, tmp_path):
    built = build(tmp_path_factory, demo_data)
    end = EndOfBill(ApiSource("runpod", api.base, "rp-key", "RUNPOD_API_KEY", 5.0, "pod-a"), tmp_path / "b",
                    built.uri)
    logs = []
    assert end_the_bill(end, 3, logs.append, Alerts())
    (query,) = [b["query"] for b in api.bodies("/graphql") if "podTerminate" in b["query"]]
    assert 'podId: "pod-a"' in query


def test_a_failed_export_keeps_the_instance_after_a_finished_run_but_not_over_the_cap(api, tmp_path):
    alerts = Alerts()
    end = EndOfBill(ApiSource("lambda", api.base, "k", "LAMBDA_API_KEY", 5.0), tmp_path / "b",
                    (tmp_path / "no-store").as_uri())
    assert not end_the_bill(end, 0, print, alerts)
    assert api.bodies("/api/v1/instance-operations/terminate") == []
    assert "NOT terminated" in alerts.sent[-1][0]
    assert end_the_bill(end, 4, print, alerts)           # over the cap: the bill ends regardless
    assert api.bodies("/api/v1/instance-operations/terminate") == [{"instance_ids": ["inst-a"]}]


def test_a_refused_terminate_is_reported(api, tmp_path):
    api.route("/api/v1/instance-operations/terminate", {"error": {"message": "instance not found"}}, status=404)
    alerts = Alerts()
    end = EndOfBill(ApiSource("lambda", api.base, "k", "LAMBDA_API_KEY", 5.0, "inst-a"), tmp_path / "b", "x")
    assert not end_the_bill(end, 4, print, alerts)
    assert "terminate FAILED" in alerts.sent[-1][0] and "HTTP 404" in alerts.sent[-1][1]
    with pytest.raises(PollError):
        end.source.terminate()
