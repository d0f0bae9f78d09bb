"""Ending the bill against local fakes of Lambda's and RunPod's APIs, with a real export_run."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from x1_pretrain.budget.providers import ApiSource, PollError
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core.fileio import sha256_file
from x1_pretrain.supervise.terminate import EndOfBill, end_the_bill

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
    s.route(
        "/api/v1/instances",
        {
            "data": [
                {
                    "id": "inst-a",
                    "status": "active",
                    "instance_type": {"name": "gpu_1x_a100", "price_cents_per_hour": 110},
                }
            ]
        },
    )
    s.route(
        "/api/v1/instance-operations/terminate",
        lambda body: (
            200,
            {
                "data": {
                    "terminated_instances": [
                        {"id": i, "status": "terminating"} for i in json.loads(body)["instance_ids"]
                    ]
                }
            },
        ),
    )
    s.route(
        "/graphql",
        lambda body: (
            200,
            {"data": {"podTerminate": None}}
            if "podTerminate" in body.decode()
            else {"data": {"myself": {"pods": [{"id": "pod-a", "costPerHr": 0.79, "desiredStatus": "RUNNING"}]}}},
        ),
    )
    yield s
    s.close()


def final_checkpoint(built, tmp_path):
    """A copy of the shared run's newest complete checkpoint (the shared build stays read-only)."""
    found = ck.find_latest_complete(built.ckpt, print)
    assert found is not None
    return shutil.copytree(found.path, tmp_path / "ckpt" / found.path.name)


def remote_objects(s3, url: str) -> dict[str, str]:
    """{key under url: sha256 of its bytes} as the real S3 server holds them now."""
    prefix = url.split("/", 3)[3]
    return {k[len(prefix) + 1 :]: hashlib.sha256(s3.get(k)).hexdigest() for k in s3.keys(prefix + "/")}


def test_lambda_after_a_finished_run_exports_uploads_verifies_then_terminates(
    api, tmp_path_factory, demo_data, tmp_path, s3, s3env
):
    built = build(tmp_path_factory, demo_data)
    remote, seen = s3env + "/bundle", []

    def terminate(body: bytes) -> tuple[int, dict]:
        seen.append(remote_objects(s3, remote))  # the bucket at the moment the terminate request arrives
        return 200, {"data": {"terminated_instances": [{"id": "inst-a", "status": "terminating"}]}}

    api.route("/api/v1/instance-operations/terminate", terminate)
    logs, alerts = [], Alerts()
    end = EndOfBill(
        ApiSource("lambda", api.base, "sk-KEY-xyz", "LAMBDA_API_KEY", 5.0),
        tmp_path / "bundle",
        built.uri,
        bundle_remote=remote,
    )
    step = final_checkpoint(built, tmp_path)
    assert end_the_bill(end, 0, logs.append, alerts, step)
    assert (tmp_path / "bundle" / "manifest.json").is_file() and (tmp_path / "bundle" / "final.safetensors").is_file()
    assert api.bodies("/api/v1/instance-operations/terminate") == [{"instance_ids": ["inst-a"]}]
    # every bundle file and every file of the final checkpoint was in the bucket, byte for byte, before it
    (there,) = seen
    for rel in ("manifest.json", "final.safetensors", "metrics.csv"):
        assert there[rel] == sha256_file(tmp_path / "bundle" / rel)
    for f in step.iterdir():
        assert there[f"checkpoint/{f.name}"] == sha256_file(f)
    assert "x1-dir.json" in there and "checkpoint/x1-dir.json" in there
    assert any("every size and sha256 read back" in line for line in logs)
    assert any("Lambda terminated instance inst-a" in line for line in logs)
    assert alerts.sent[-1][0] == "x1: instance terminated" and "sk-KEY-xyz" not in "".join(logs)
    # the key went in the header, nowhere else
    (_, _, headers, _), *_ = [r for r in api.requests if "terminate" in r[1]]
    assert headers["Authorization"] == "Bearer sk-KEY-xyz"


def test_runpod_terminates_the_pod_it_was_told(api, tmp_path_factory, demo_data, tmp_path, s3env):
    built = build(tmp_path_factory, demo_data)
    end = EndOfBill(
        ApiSource("runpod", api.base, "rp-key", "RUNPOD_API_KEY", 5.0, "pod-a"),
        tmp_path / "b",
        built.uri,
        bundle_remote=s3env,
    )
    logs = []
    assert end_the_bill(end, 3, logs.append, Alerts(), final_checkpoint(built, tmp_path))
    (query,) = [b["query"] for b in api.bodies("/graphql") if "podTerminate" in b["query"]]
    assert 'podId: "pod-a"' in query


def test_a_failing_store_means_no_terminate_and_an_alert_with_what_is_missing_and_the_rate(
    api, tmp_path_factory, demo_data, tmp_path, s3env
):
    built = build(tmp_path_factory, demo_data)
    alerts = Alerts()
    end = EndOfBill(
        ApiSource("lambda", api.base, "k", "LAMBDA_API_KEY", 5.0),
        tmp_path / "b",
        built.uri,
        bundle_remote="s3://no-such-bucket-x1/run/bundle",
    )  # the real server has no such bucket
    assert not end_the_bill(end, 0, print, alerts, final_checkpoint(built, tmp_path))
    assert api.bodies("/api/v1/instance-operations/terminate") == []
    subject, body = alerts.sent[-1]
    assert subject == "x1: instance NOT terminated (bundle not uploaded)"
    assert "s3://no-such-bucket-x1/run/bundle:" in body and "s3://no-such-bucket-x1/run/bundle/checkpoint:" in body
    assert "$1.10/h ($26.40 a day)" in body and (tmp_path / "b" / "manifest.json").is_file()


def test_without_a_remote_terminate_is_refused_and_says_why(api, tmp_path_factory, demo_data, tmp_path):
    built = build(tmp_path_factory, demo_data)
    alerts, logs = Alerts(), []
    end = EndOfBill(ApiSource("lambda", api.base, "k", "LAMBDA_API_KEY", 5.0), tmp_path / "b", built.uri)
    assert not end_the_bill(end, 0, logs.append, alerts, final_checkpoint(built, tmp_path))
    assert api.bodies("/api/v1/instance-operations/terminate") == []
    subject, body = alerts.sent[-1]
    assert subject == "x1: instance NOT terminated (no remote for the bundle)"
    assert "instance's own disk, which terminating destroys" in body and "--bundle-remote" in body
    assert "$1.10/h" in body and (tmp_path / "b" / "manifest.json").is_file()  # exported, kept


def test_a_failed_export_keeps_the_instance_after_a_finished_run_but_not_over_the_cap(api, tmp_path):
    alerts = Alerts()
    end = EndOfBill(
        ApiSource("lambda", api.base, "k", "LAMBDA_API_KEY", 5.0),
        tmp_path / "b",
        (tmp_path / "no-store").as_uri(),
        bundle_remote="s3://x1-runs/never-reached",
    )
    assert not end_the_bill(end, 0, print, alerts)
    assert api.bodies("/api/v1/instance-operations/terminate") == []
    assert "NOT terminated" in alerts.sent[-1][0]
    assert end_the_bill(end, 4, print, alerts)  # over the cap: the bill ends regardless
    assert api.bodies("/api/v1/instance-operations/terminate") == [{"instance_ids": ["inst-a"]}]


def test_a_refused_terminate_is_reported(api, tmp_path):
    api.route("/api/v1/instance-operations/terminate", {"error": {"message": "instance not found"}}, status=404)
    alerts = Alerts()
    end = EndOfBill(
        ApiSource("lambda", api.base, "k", "LAMBDA_API_KEY", 5.0, "inst-a"),
        tmp_path / "b",
        "x",
        bundle_remote="s3://x1-runs/never-reached",
    )
    assert not end_the_bill(end, 4, print, alerts)
    assert "terminate FAILED" in alerts.sent[-1][0] and "HTTP 404" in alerts.sent[-1][1]
    with pytest.raises(PollError):
        end.source.terminate()
