"""Secrets never leave the process: a budget URL with a token in its query and userinfo, and a Slack webhook
whose path is the credential, and the checkpoint mirror's S3 key, are grep-clean across every output of a run
(console, MLflow store, checkpoint dir, ledger, exit status, the exported bundle, every object in the bucket)
and of the watchdog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from .conftest import REPO
from .procs import train_cmd
from .servers import JsonServer

TOKEN = "tok-3f9a-SECRET-budget"
PASSWORD = "pw-77-SECRET-user"
HOOK_SECRET = "T000-B000-SECRET-hook"


def _files(*dirs: Path):
    for d in dirs:
        for p in d.rglob("*"):
            if p.is_file():
                yield p


def test_no_output_of_a_run_holds_a_secret(demo_data, tmp_path, s3, s3env, monkeypatch, capfd):
    api = JsonServer()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.route(
        "/budget.json",
        {
            "spent_usd": 31.0,
            "rate_usd_per_hr": 1.1,
            "hours_elapsed": 1,
            "projected_total_usd": 31.5,
            "last_update_utc": stamp,
        },
    )  # above the alert line
    api.route(f"/services/{HOOK_SECRET}", {"ok": True})
    host = api.base.removeprefix("http://")
    source = f"http://x1:{PASSWORD}@{host}/budget.json?token={TOKEN}"
    ckpt, mlruns, bundle = tmp_path / "c", tmp_path / "mlruns", tmp_path / "bundle"
    env = {**os.environ, **s3.env, "X1_SLACK_WEBHOOK_URL": f"{api.base}/services/{HOOK_SECRET}"}
    s3_secrets = (s3.env["AWS_SECRET_ACCESS_KEY"], s3.env["AWS_ACCESS_KEY_ID"])  # the checkpoint mirror's key
    try:
        cmd = [
            sys.executable,
            "-m",
            "x1_pretrain.watchdog",
            "--budget-poll-s",
            "0.5",
            "--",
            *train_cmd(
                demo_data,
                ckpt,
                6,
                "--mlflow-uri",
                mlruns.as_uri(),
                "--budget-cap-usd",
                "35",
                "--budget-curr-cost-uri",
                source,
                "--budget-check-every-min",
                "0.01",
                "--force-launch",
                "--ckpt-remote",
                s3env,
                ckpt_every=3,
            ),
        ]
        r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        # the export in this process (its behaviour needs no process of its own), under the same variables
        from x1_pretrain import export_run

        monkeypatch.setenv("X1_SLACK_WEBHOOK_URL", env["X1_SLACK_WEBHOOK_URL"])
        capfd.readouterr()
        code = export_run.main(["--mlflow-uri", mlruns.as_uri(), "--output", str(bundle)])
        e = capfd.readouterr()
        assert code == 0, e.err[-3000:]
    finally:
        api.close()
    # the secrets were really used: the source was read with them, and the alert went to the hook
    assert any(TOKEN in path for _, path, _, _ in api.requests)
    assert any(HOOK_SECRET in path for _, path, _, _ in api.requests)
    outputs = {"train/watchdog console": r.stdout + r.stderr, "export console": e.out + e.err}
    for p in _files(ckpt, mlruns, bundle):
        outputs[str(p)] = p.read_bytes().decode("utf-8", "replace")
    mirrored = s3.keys(s3env.split("/", 3)[3] + "/")
    assert "latest" in {k.rsplit("/", 1)[-1] for k in mirrored} and any("/mlruns/" in k for k in mirrored)
    for key in mirrored:  # and everything the mirror put in the bucket
        outputs[f"s3:{key}"] = s3.get(key).decode("utf-8", "replace")
    leaks = [
        (where, s) for where, text in outputs.items() for s in (TOKEN, PASSWORD, HOOK_SECRET, *s3_secrets) if s in text
    ]
    assert not leaks, leaks
    # and what they were replaced by is still useful
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert f"http://***@{host}/budget.json?token=***" in manifest["dollars"]["source"]


MLFLOW_PASSWORD = "s3cr3t-77-SECRET-mlflow"


def test_an_mlflow_password_reaches_no_output_bundle_and_postmortem_included(demo_data, tmp_path, monkeypatch, capfd):
    """A run logged to a password-protected MLflow server (a real MLflow tracking server behind Basic auth) with
    the password in --mlflow-uri: the trainer uses it, warns once that ps shows it and names the variables to use
    instead; the bundle (manifest, mlflow-run-uri.txt), the post-mortem, the logs, the checkpoint dir and every
    console hold it masked. MLflow's own MLFLOW_TRACKING_USERNAME / _PASSWORD work instead of the URL; a wrong
    password is one clean error without it."""
    from x1_pretrain import export_run, postmortem
    from x1_pretrain.core import redact
    from x1_pretrain.report import runs

    from .mlflow_server import MlflowServer

    ckpt, bundle, log = tmp_path / "c", tmp_path / "bundle", tmp_path / "watchdog.log"
    with MlflowServer(tmp_path / "server", "alice", MLFLOW_PASSWORD) as server:
        uri = server.uri_with_password
        cmd = [
            sys.executable,
            "-m",
            "x1_pretrain.watchdog",
            "--log-file",
            str(log),
            "--",
            *train_cmd(
                demo_data,
                ckpt,
                6,
                "--mlflow-uri",
                uri,
                "--inject-spike-at-step",
                "4",
                "--spike-batches",
                "2",
                ckpt_every=3,
            ),
        ]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        used = server.authorized()
        monkeypatch.setattr(redact, "_warned", set())  # in this process: export and post-mortem, each warned
        capfd.readouterr()
        assert export_run.main(["--mlflow-uri", uri, "--output", str(bundle)]) == 0
        exported = capfd.readouterr()
        assert postmortem.main(["--mlflow-uri", uri, "--output", str(bundle / "spike-postmortem.md")]) == 0
        drafted = capfd.readouterr()
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")  # MLflow's own variables instead of the URL
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_PASSWORD)
        assert runs.load_run(server.uri).uri == server.uri
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
        with pytest.raises(runs.StoreUnreadable) as wrong:  # a wrong password: one line (exit 1), without it
            runs.load_run(uri.replace(MLFLOW_PASSWORD, "wr0ng-SECRET-pw"))
    assert used > 0 and server.authorized() > used  # the trainer, then the export, logged in with it
    assert (bundle / "spike-postmortem.md").is_file() and (bundle / "manifest.json").is_file()
    assert wrong.value.exit_code == 1 and "could not be read" in str(wrong.value)
    assert "wr0ng-SECRET-pw" not in str(wrong.value) and "alice" not in str(wrong.value)
    console = r.stdout + r.stderr + (log.read_text() if log.exists() else "")  # the log: once the terminal is gone
    shown = f"http://***@127.0.0.1:{server.port}/"
    assert console.count("--mlflow-uri " + shown + " carries a secret") == 1, console[-3000:]
    assert "MLFLOW_TRACKING_PASSWORD" in console and "carries a secret" in exported.err + drafted.err
    outputs = {
        "watchdog": console,
        "export": exported.out + exported.err,
        "postmortem": drafted.out + drafted.err,
        **{str(p): p.read_bytes().decode("utf-8", "replace") for p in _files(ckpt, bundle)},
    }
    leaks = [
        (where, text[max(text.find(MLFLOW_PASSWORD) - 300, 0) : text.find(MLFLOW_PASSWORD) + 100])
        for where, text in outputs.items()
        if MLFLOW_PASSWORD in text
    ]
    assert not leaks, leaks
    assert json.loads((bundle / "manifest.json").read_text())["mlflow"]["uri"] == shown
    assert f"tracking_uri: {shown}" in (bundle / "mlflow-run-uri.txt").read_text()
    assert f"`{shown}`" in (bundle / "spike-postmortem.md").read_text()
