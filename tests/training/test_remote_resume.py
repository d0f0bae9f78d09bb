"""Resuming from the remote: the pull (verified, the ledger that counted more, the MLflow copy), and whole runs
against a real S3 server on 127.0.0.1: killed mid-upload then resumed from an empty disk gives the same final
weights bit for bit; a store that cannot be reached leaves training at exit 0; wrong credentials are exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from x1_pretrain.budget.ledger import LEDGER_FILE
from x1_pretrain.core.objstore import RemoteURL, Store
from x1_pretrain.training import checkpoint as ck
from x1_pretrain.training.mirror import Mirror
from x1_pretrain.training.remote_resume import RemoteUnavailable, pull

from ..procs import losses, progress_step, start, train_cmd, wait_for
from ..s3server import Proxy, free_port
from .test_mirror import _step


def _ledger(spent: float) -> str:
    return json.dumps({"format": "x1-budget-ledger/1", "cap_usd": 35.0, "memory": {"spent_usd": spent}})


def test_pull_takes_the_newest_remote_checkpoint_that_verifies_and_the_larger_ledger(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    src = tmp_path / "machine-a"
    mirror = Mirror(store, src, keep_last=3, log=print).start()
    for step in (3, 6):
        mirror.checkpoint(_step(src, step, mb=0.2))
        assert mirror.drain(60)
    mirror.close()
    store.put_bytes(b"not the weights that were saved", "step_0000006/model.safetensors")   # bit rot remotely
    store.put_bytes(_ledger(21.5).encode(), LEDGER_FILE)
    dst = tmp_path / "machine-b"
    dst.mkdir()
    (dst / LEDGER_FILE).write_text(_ledger(2.0))        # a new machine's own, smaller count
    lines: list[str] = []
    assert pull(store, dst, lines.append) == "step_0000003"
    assert any("step_0000006 fails verification" in x for x in lines)
    assert ck.verify(dst / "step_0000003")[0] is not None and ck.read_latest(dst) == "step_0000003"
    assert json.loads((dst / LEDGER_FILE).read_text())["memory"]["spent_usd"] == 21.5
    assert not [p for p in dst.iterdir() if p.name.startswith(".")]   # nothing half-downloaded is left
    assert pull(store, dst, lines.append) is None    # nothing newer than what is here now


def test_an_unreadable_remote_with_nothing_local_is_exit_1_not_a_fresh_start(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAX1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x1")
    store = Store(RemoteURL.parse("s3://bucket-x1/p"), connect_timeout_s=1, attempts=1)
    with pytest.raises(RemoteUnavailable, match="not starting fresh") as e:
        pull(store, tmp_path / "empty", print)
    assert e.value.exit_code == 1


def _run(cmd, env, log):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    log.write_text(out.stdout)
    return out


@pytest.mark.slow
def test_killed_mid_upload_then_resumed_from_an_empty_disk_gives_the_same_weights(s3, s3env, demo_data, tmp_path):
    steps = ("--set", "checkpoint.async_save=true")
    ref = tmp_path / "ref"
    assert _run(train_cmd(demo_data, ref, 12, *steps, ckpt_every=4), os.environ, tmp_path / "ref.log").returncode == 0
    proxy = Proxy(s3.port)
    # the first request for the checkpoint after step 4 hangs (step 8's, or step 12's when 12 was written while step
    # 4 was still going up and replaced the unstarted 8): the machine dies mid-upload
    proxy.hold_on = (b"step_0000008", b"step_0000012")
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
    a = tmp_path / "machine-a"
    try:
        proc = start(train_cmd(demo_data, a, 12, *steps, "--ckpt-remote", s3env, ckpt_every=4), tmp_path / "a.log",
                     env)
        wait_for(lambda: not proxy.flowing.is_set() and ck.read_latest(a) in ("step_0000008", "step_0000012"),
                 proc=proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proxy.close()
    store = Store(RemoteURL.parse(s3env))
    assert store.get_bytes("latest") == b"step_0000004\n"
    assert not [k for k in store.list_objects() if k.startswith(("step_0000008", "step_0000012"))]
    b = tmp_path / "machine-b"     # an empty disk: no checkpoint, no ledger, no MLflow store
    out = _run(train_cmd(demo_data, b, 12, *steps, "--ckpt-remote", s3env, "--resume-from-latest", ckpt_every=4,
                         seed=False), os.environ, tmp_path / "b.log")
    assert out.returncode == 0, out.stdout[-3000:]
    assert "step_0000004 came down" in out.stdout and "MLflow store came down" in out.stdout
    assert (b / ck.FINAL_MODEL).read_bytes() == (ref / ck.FINAL_MODEL).read_bytes()
    assert set(losses(b)) >= set(range(1, 13))     # one MLflow run: A's steps came down with its store
    assert store.get_bytes("latest") == b"step_0000012\n"
    assert json.loads(store.get_bytes(ck.EXIT_STATUS))["exit_code"] == 0


@pytest.mark.slow
def test_a_store_that_cannot_be_reached_leaves_training_at_exit_0(demo_data, tmp_path):
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "AKIAX1",
           "AWS_SECRET_ACCESS_KEY": "x1-unreachable-secret", "AWS_DEFAULT_REGION": "us-east-1"}
    ckpt = tmp_path / "c"
    out = _run(train_cmd(demo_data, ckpt, 6, "--ckpt-remote", "s3://x1-runs/down", ckpt_every=3), env,
               tmp_path / "log")
    assert out.returncode == 0, out.stdout[-3000:]
    assert ck.read_latest(ckpt) == "step_0000006" and (ckpt / ck.FINAL_MODEL).is_file()
    assert out.stdout.count("WARNING: the mirror to") == 1
    assert "cannot be reached now" in out.stdout and "could not upload" in out.stdout
    assert "x1-unreachable-secret" not in out.stdout


def test_wrong_credentials_are_exit_2_at_launch_with_the_fix(s3, s3env, demo_data, tmp_path):
    env = {**os.environ, **s3.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret-4242"}
    ckpt = tmp_path / "c"
    out = _run(train_cmd(demo_data, ckpt, 4, "--ckpt-remote", s3env, seed=False), env, tmp_path / "log")
    assert out.returncode == 2, out.stdout[-3000:]
    assert "refused the credentials" in out.stdout and "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in out.stdout
    assert "not-the-secret-4242" not in out.stdout and "Traceback" not in out.stdout
    assert not ckpt.exists()     # nothing was written before the check


def test_a_file_store_goes_up_file_by_file_and_comes_back_whole(s3env, tmp_path):
    """The lab's --mlflow-uri file:///... store: only the files changed since the last upload go up again, and
    an empty machine gets the whole folder back (renamed into place once complete)."""
    from x1_pretrain.training.mirror import MlflowStore

    store = Store(RemoteURL.parse(s3env))
    mlruns = tmp_path / "mlruns"
    (mlruns / "1" / "run" / "metrics").mkdir(parents=True)
    (mlruns / "1" / "meta.yaml").write_text("name: x1-pretraining\n")
    metric = mlruns / "1" / "run" / "metrics" / "train" / "loss"
    metric.parent.mkdir()
    metric.write_text("1 10.9 1\n")
    calls: list[str] = []
    store.client.meta.events.register("before-parameter-build.s3.PutObject", lambda params, **_: calls.append(
        params["Key"]))
    mirror = Mirror(store, tmp_path / "c", keep_last=3, log=print).start()
    mirror.mlflow(MlflowStore(mlruns, sqlite=False))
    assert mirror.drain(60)
    with open(metric, "a") as f:
        f.write("2 10.7 2\n")
    mirror.mlflow(MlflowStore(mlruns, sqlite=False))
    assert mirror.drain(60)
    mirror.close()
    assert [c.rsplit("/", 1)[-1] for c in calls] == ["meta.yaml", "loss", "loss"] or \
        sorted(c.rsplit("/", 1)[-1] for c in calls) == ["loss", "loss", "meta.yaml"]
    back = tmp_path / "machine-b" / "mlruns"
    pull(store, tmp_path / "machine-b" / "c", print, MlflowStore(back, sqlite=False))
    assert (back / "1" / "run" / "metrics" / "train" / "loss").read_text() == "1 10.9 1\n2 10.7 2\n"
    assert (back / "1" / "meta.yaml").read_text() == "name: x1-pretraining\n"


@pytest.mark.slow
def test_a_stop_uploads_its_checkpoint_and_the_watchdog_resumes_on_an_empty_disk(s3env, demo_data, tmp_path):
    """SIGTERM: the stop checkpoint is in the bucket before the process exits 75 (and its exit status); then the
    watchdog, on a machine with nothing local, relaunches the same command and finishes from the bucket."""
    a = tmp_path / "machine-a"
    proc = start(train_cmd(demo_data, a, 10, "--ckpt-remote", s3env, ckpt_every=1000), tmp_path / "a.log",
                 dict(os.environ))
    wait_for(lambda: progress_step(a) >= 3, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 75
    store = Store(RemoteURL.parse(s3env))
    stopped = ck.read_latest(a)
    assert stopped is not None and store.get_bytes("latest") == f"{stopped}\n".encode()
    assert json.loads(store.get_bytes(ck.EXIT_STATUS))["exit_code"] == 75
    assert "is up to date" in (tmp_path / "a.log").read_text()
    b = tmp_path / "machine-b"
    cmd = [sys.executable, "-m", "x1_pretrain.watchdog", "--backoff-s", "0.1", "--",
           *train_cmd(demo_data, b, 10, "--ckpt-remote", s3env, "--resume-from-latest", ckpt_every=1000, seed=False)]
    out = _run(cmd, os.environ, tmp_path / "b.log")
    assert out.returncode == 0, out.stdout[-3000:]
    assert f"{stopped} came down" in out.stdout
    assert min(losses(b)) == 1 and max(losses(b)) == 10      # A's steps (its MLflow copy) and B's, one run
    assert store.get_bytes("latest") == b"step_0000010\n"


def _budget_file(path, machine: str, spent: float) -> str:
    from datetime import datetime, timezone

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(json.dumps({"spent_usd": spent, "rate_usd_per_hr": 1.10, "hours_elapsed": 1.0,
                                "projected_total_usd": spent + 1.0, "last_update_utc": stamp, "provider": "runpod",
                                "resource_id": machine}))
    return str(path)


@pytest.mark.slow
def test_the_cap_holds_for_the_sum_of_two_machines(s3env, demo_data, tmp_path):
    """Machine A spent $20 and was lost; machine B's sidecar counts only B ($16, under the cap alone). Resumed on
    B from the bucket, the ledger brings A's spend along: $36 is over the $35 cap and B does not train."""
    budget = ("--budget-cap-usd", "35", "--budget-alert-usd", "34", "--budget-expected-step-s", "0.01")
    a = tmp_path / "machine-a"
    out = _run(train_cmd(demo_data, a, 4, "--ckpt-remote", s3env, *budget, "--budget-curr-cost-uri",
                         _budget_file(tmp_path / "a.json", "pod-a", 20.0), ckpt_every=2), os.environ,
               tmp_path / "a.log")
    assert out.returncode == 0, out.stdout[-3000:]
    b = tmp_path / "machine-b"
    b_json = _budget_file(tmp_path / "b.json", "pod-b", 16.0)
    out = _run(train_cmd(demo_data, b, 4, "--ckpt-remote", s3env, "--resume-from-latest", *budget,
                         "--budget-curr-cost-uri", b_json, ckpt_every=2, seed=False), os.environ, tmp_path / "b.log")
    assert out.returncode == 3, out.stdout[-3000:]
    assert "the cost ledger came down ($20.0" in out.stdout
    assert "spent $36.0" in out.stdout and "over the cap $35.00" in out.stdout   # $20 on A + $16 on B


def test_the_other_processes_of_a_node_wait_for_the_pull_and_share_its_failure(tmp_path, monkeypatch):
    from x1_pretrain.training.remote_resume import PULLED, pulled_marker, wait_for_pull

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    ckpt = tmp_path / "c"
    with pulled_marker(ckpt, others_wait=True):
        pass
    wait_for_pull(ckpt, print, timeout_s=5)          # this launch's marker: go
    old = (ckpt / PULLED).stat().st_mtime - 3600
    os.utime(ckpt / PULLED, (old, old))               # a marker an earlier launch left: not this one's
    with pytest.raises(RemoteUnavailable, match="did not finish pulling"):
        wait_for_pull(ckpt, print, timeout_s=0.5, every_s=0.05)
    with pytest.raises(RemoteUnavailable), pulled_marker(ckpt, others_wait=True):
        raise RemoteUnavailable("the store is down")
    with pytest.raises(RemoteUnavailable, match="the store is down") as e:
        wait_for_pull(ckpt, print, timeout_s=5)
    assert e.value.exit_code == 1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")   # the next restart does not take the old verdict
    with pytest.raises(RemoteUnavailable, match="did not finish pulling"):
        wait_for_pull(ckpt, print, timeout_s=0.5, every_s=0.05)
