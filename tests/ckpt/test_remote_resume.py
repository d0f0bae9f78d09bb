"""Resuming from the remote: the pull (verified, the ledger that counted more, the MLflow copy), and whole runs
against a real S3 server on 127.0.0.1: killed mid-upload then resumed from an empty disk gives the same final
weights bit for bit; a store that cannot be reached leaves training at exit 0; wrong credentials are exit 2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from x1_pretrain.budget.ledger import LEDGER_FILE
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.ckpt import remote_resume as RR
from x1_pretrain.ckpt.mirror import Mirror
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.ckpt.remote_resume import RemoteUnavailable, pull
from x1_pretrain.core import contract
from x1_pretrain.core.contract import EXIT_STORE_UNAVAILABLE
from x1_pretrain.core.errors import X1Error

from ..procs import losses, progress_step, start, train_cmd, train_here, wait_for
from ..s3server import Proxy, free_port
from .test_mirror import _step


def _proof(machine: Path) -> dict[str, str]:
    """What a new machine gives to continue ``machine``'s run on its prefix (X1_RUN_ID, docs/running.md)."""
    from x1_pretrain.ckpt import run_owner

    return {"X1_RUN_ID": run_owner.local_id(machine) or ""}


# a narrower model and a smaller batch for the runs whose property does not depend on the shape (a checkpoint
# of a fifth of the bytes goes up and comes down faster); gradient accumulation stays at two micro-steps
NARROW = (
    "--set",
    "model.d_model=32",
    "--set",
    "model.d_ff=96",
    "--set",
    "train.batch_size=8",
    "--set",
    "train.micro_batch_size=4",
)


def _ledger(spent: float) -> str:
    return json.dumps({"format": "x1-budget-ledger/1", "cap_usd": 35.0, "memory": {"spent_usd": spent}})


def test_pull_takes_the_newest_remote_checkpoint_that_verifies_and_the_larger_ledger(s3env, tmp_path, monkeypatch):
    store = Store(RemoteURL.parse(s3env))
    src = tmp_path / "machine-a"
    mirror = Mirror(store, src, keep_last=3, log=print).start()
    for step in (3, 6):
        mirror.checkpoint(_step(src, step, mb=0.2))
        assert mirror.drain(60)
    mirror.close()
    store.put_bytes(b"not the weights that were saved", "step_0000006/model.safetensors")  # bit rot remotely
    store.put_bytes(_ledger(21.5).encode(), LEDGER_FILE)
    dst = tmp_path / "machine-b"
    dst.mkdir()
    (dst / LEDGER_FILE).write_text(_ledger(2.0))  # a new machine's own, smaller count
    monkeypatch.setenv("X1_RUN_ID", _proof(src)["X1_RUN_ID"])
    lines: list[str] = []
    assert pull(store, dst, lines.append) == "step_0000003"
    assert any("step_0000006 fails verification" in x for x in lines)
    assert ck.verify(dst / "step_0000003")[0] is not None and ck.read_latest(dst) == "step_0000003"
    assert json.loads((dst / LEDGER_FILE).read_text())["memory"]["spent_usd"] == 21.5
    assert not [p for p in dst.iterdir() if p.name.startswith(".")]  # nothing half-downloaded is left
    assert pull(store, dst, lines.append) is None  # nothing newer than what is here now


def test_an_unreachable_remote_with_nothing_local_is_waited_for_then_exit_8_not_a_fresh_start(tmp_path, monkeypatch):
    """No server on the port (ECONNREFUSED): the pauses between tries double from WAIT_FIRST_S up to WAIT_MAX_S and
    the last one ends at the deadline; each try says what it waits for and until when; then exit 8."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAX1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x1-waiting-secret")
    monkeypatch.setattr(RR, "WAIT_FIRST_S", 0.05)
    monkeypatch.setattr(RR, "WAIT_MAX_S", 0.2)
    store = Store(RemoteURL.parse("s3://bucket-x1/p"), connect_timeout_s=1, attempts=1)
    with pytest.raises(RemoteUnavailable):  # one look, no wait: pull itself never starts fresh
        pull(store, tmp_path / "empty", print)
    lines: list[str] = []
    t0 = time.monotonic()
    with pytest.raises(RR.StoreUnavailable, match="not starting fresh") as e:
        RR.pull_when_reachable(store, tmp_path / "empty", lines.append, wait_min=3 / 60)
    assert e.value.exit_code == EXIT_STORE_UNAVAILABLE == 8 and 2.9 < time.monotonic() - t0 < 15
    waits = [x for x in lines if x.startswith("remote: waiting for s3://bucket-x1/p")]
    assert all("giving up at" in x and "UTC (checkpoint.remote_wait_min 0.05), then exit 8" in x for x in waits)
    pauses = [float(re.search(r"in (\d+\.\d) s;", x).group(1)) for x in waits]
    # 0.05, 0.1, 0.2, 0.2, ... (shown to 0.1 s); the last one ends at the deadline
    assert len(pauses) >= 4 and pauses[:-1] == [round(min(0.05 * 2**i, 0.2), 1) for i in range(len(pauses) - 1)]
    assert pauses[-1] <= 0.2
    assert "x1-waiting-secret" not in " ".join(lines) + str(e.value)
    assert not (tmp_path / "empty").exists() or not any((tmp_path / "empty").iterdir())


def test_a_store_that_comes_up_during_the_wait_is_resumed_from(s3, s3env, tmp_path, monkeypatch):
    store = Store(RemoteURL.parse(s3env))
    src = tmp_path / "machine-a"
    mirror = Mirror(store, src, keep_last=3, log=print).start()
    mirror.checkpoint(_step(src, 3, mb=0.1))
    assert mirror.drain(60)
    mirror.close()
    proxy = Proxy(s3.port, listening=False)  # machine B starts while the store refuses connections
    monkeypatch.setenv("X1_RUN_ID", _proof(src)["X1_RUN_ID"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setattr(RR, "WAIT_FIRST_S", 0.05)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("remote: waiting for"):
            proxy.listen()  # the store comes up after the first announced try

    try:
        dst = tmp_path / "machine-b"
        assert RR.pull_when_reachable(Store(RemoteURL.parse(s3env)), dst, log, wait_min=5) == "step_0000003"
    finally:
        proxy.close()
    assert ck.read_latest(dst) == "step_0000003" and ck.verify(dst / "step_0000003")[0] is not None
    assert [x.split(" (")[0] for x in lines if x.startswith("remote:")][:3] == [
        f"remote: waiting for {s3env} at {proxy.endpoint} to answer",
        f"remote: {s3env} answers again after 1 tries: resuming from it",
        "remote: step_0000003 came down from " + s3env,
    ]


def test_credentials_refused_when_the_store_comes_up_end_the_wait_with_exit_2(s3, s3env, tmp_path, monkeypatch):
    proxy = Proxy(s3.port, listening=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-4243")
    monkeypatch.setattr(RR, "WAIT_FIRST_S", 0.05)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if line.startswith("remote: waiting for"):
            proxy.listen()

    try:
        with pytest.raises(X1Error, match="refused the credentials") as e:
            RR.pull_when_reachable(Store(RemoteURL.parse(s3env)), tmp_path / "b", log, wait_min=5)
    finally:
        proxy.close()
    assert e.value.exit_code == 2 and len([x for x in lines if "waiting for" in x]) == 1  # no more waiting
    assert "not-the-secret-4243" not in str(e.value)


def _run(cmd, env, log):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    log.write_text(out.stdout)
    return out


def _here(cmd, capsys) -> tuple[int, str]:
    """``cmd`` (a train command) run in this process: its exit code and what it printed (stdout, then stderr)."""
    capsys.readouterr()
    code = train_here(cmd)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_store_down_when_a_new_machine_starts_is_waited_for_then_the_run_resumes_adopts_and_prunes_its_own(
    s3, s3env, demo_data, tmp_path, monkeypatch, capsys
):
    """Machine A mirrors step 2 (keep_last 1), owns the prefix and is gone. Machine B starts with an empty disk while
    the store refuses connections: it waits (saying so, nothing trained or pulled meanwhile), the store comes up,
    and B resumes A's checkpoint in A's MLflow run under A's run id (X1_RUN_ID, kept while the store was down;
    the adoption at a launch that reaches the store is in the killed-mid-upload test), trains on, prunes A's
    old step (the same run's) to keep_last and leaves a step dir no run of ours wrote. Both run in this process:
    the wait and the resume need no process of their own (a real process waiting is
    test_sigterm_while_waiting_for_the_store_ends_the_wait_cleanly)."""
    from x1_pretrain.ckpt import run_owner

    keep = ("--set", "checkpoint.keep_last=1", *NARROW)
    a = tmp_path / "machine-a"
    assert train_here(train_cmd(demo_data, a, 2, "--ckpt-remote", s3env, *keep, ckpt_every=2)) == 0
    store = Store(RemoteURL.parse(s3env))
    owner = run_owner.local_id(a)
    assert owner and run_owner.remote_id(store) == owner
    store.put_bytes(b"someone else's", "step_0000001/model.safetensors")  # not written by this run: it stays
    proxy = Proxy(s3.port, listening=False)  # bound, not listening: every connect is refused
    b = tmp_path / "machine-b"
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("X1_RUN_ID", owner)  # the proof that it is run A (docs/running.md)
    monkeypatch.setattr(RR, "WAIT_FIRST_S", 0.05)
    seen_while_waiting: list[object] = []
    sleep = RR._sleep

    def store_comes_up(seconds: float, heard: list[str]) -> None:  # the first announced pause: the store is back
        seen_while_waiting.append(ck.read_latest(b))
        proxy.listen()
        sleep(seconds, heard)

    monkeypatch.setattr(RR, "_sleep", store_comes_up)
    try:
        code, text = _here(
            train_cmd(
                demo_data,
                b,
                4,
                "--ckpt-remote",
                s3env,
                "--resume-from-latest",
                *keep,
                "--allow-config-change",
                ckpt_every=2,
                seed=False,
            ),
            capsys,
        )
    finally:
        proxy.close()
    assert code == 0, text[-3000:]
    assert seen_while_waiting[:1] == [None]  # nothing trained, nothing came down while it waited
    assert "connect" in text.split("remote: waiting for", 1)[1].split("\n")[0].lower()  # what it waited on
    assert "answers again" in text and "step_0000002 came down" in text and "MLflow store came down" in text
    assert run_owner.local_id(b) == owner  # kept from X1_RUN_ID while the store was down
    assert ck.read_latest(b) == "step_0000004" and set(losses(b)) == set(range(1, 5))  # A's steps, then B's
    assert {k.split("/")[0] for k in store.list_objects("step_")} == {"step_0000001", "step_0000004"}
    assert store.get_bytes("latest") == b"step_0000004\n"
    assert store.head("step_0000004/DONE")[1] == {run_owner.META_KEY: owner}


def test_a_store_that_never_comes_back_within_the_wait_is_exit_8(demo_data, tmp_path, monkeypatch, capsys):
    from x1_pretrain import train

    for k, v in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "AKIAX1",
        "AWS_SECRET_ACCESS_KEY": "x1-down-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    ckpt = tmp_path / "c"
    code = train.main(
        train_cmd(
            demo_data,
            ckpt,
            4,
            "--ckpt-remote",
            "s3://x1-runs/down",
            "--resume-from-latest",
            "--checkpoint-remote-wait-min",
            "0.02",
        )[3:]
    )
    out = capsys.readouterr()
    assert code == 8, out.out[-3000:] + out.err[-3000:]
    assert "remote: waiting for s3://x1-runs/down" in out.out and "(checkpoint.remote_wait_min 0.02)" in out.out
    assert "could not be reached for checkpoint.remote_wait_min 0.02 min" in out.err and "Exit 8" in out.err
    assert "Traceback" not in out.err and "x1-down-secret" not in out.out + out.err
    assert not list(ckpt.glob("step_*")) and contract.read_exit_status(ckpt)["exit_code"] == 8  # for the watchdog


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_store_ends_the_wait_cleanly(demo_data, tmp_path):
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "AKIAX1",
        "AWS_SECRET_ACCESS_KEY": "x1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    ckpt, log = tmp_path / "c", tmp_path / "log"
    proc = start(train_cmd(demo_data, ckpt, 4, "--ckpt-remote", "s3://x1-runs/down", "--resume-from-latest"), log, env)
    try:
        wait_for(lambda: "remote: waiting for" in log.read_text(), proc=proc, timeout=300)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the watchdog's budget line, or the VM going away
        assert proc.wait(60) == 75 and time.monotonic() - t0 < 15, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "SIGTERM heard while waiting for the checkpoint store" in text and "Traceback" not in text
    assert not list(ckpt.glob("step_*"))


@pytest.mark.slow
def test_killed_mid_upload_then_resumed_from_an_empty_disk_gives_the_same_weights(
    s3, s3env, demo_data, tmp_path, monkeypatch, capsys
):
    """Machine A (a real process) is SIGKILLed while step 4's checkpoint is on the wire; machine B resumes from the
    remote's step 2 on an empty disk and ends with the weights of an uninterrupted run, bit for bit. The reference
    run and B need no process of their own: they run here."""
    from x1_pretrain.ckpt import run_owner

    steps = ("--set", "checkpoint.async_save=true", *NARROW)
    ref = tmp_path / "ref"
    assert train_here(train_cmd(demo_data, ref, 4, *steps, ckpt_every=2)) == 0
    proxy = Proxy(s3.port)
    proxy.hold_on = b"step_0000004"  # the first request for the checkpoint after step 2 hangs: A dies mid-upload
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
    a = tmp_path / "machine-a"
    try:
        proc = start(train_cmd(demo_data, a, 4, *steps, "--ckpt-remote", s3env, ckpt_every=2), tmp_path / "a.log", env)
        wait_for(lambda: not proxy.flowing.is_set() and ck.read_latest(a) == "step_0000004", proc=proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proxy.close()
    store = Store(RemoteURL.parse(s3env))
    assert store.get_bytes("latest") == b"step_0000002\n"
    assert not [k for k in store.list_objects() if k.startswith("step_0000004")]
    b = tmp_path / "machine-b"  # an empty disk: no checkpoint, no ledger, no MLflow store
    monkeypatch.setenv("X1_RUN_ID", _proof(a)["X1_RUN_ID"])
    code, out = _here(
        train_cmd(demo_data, b, 4, *steps, "--ckpt-remote", s3env, "--resume-from-latest", ckpt_every=2, seed=False),
        capsys,
    )
    assert code == 0, out[-3000:]
    assert "step_0000002 came down" in out and "MLflow store came down" in out
    owner = _proof(a)["X1_RUN_ID"]  # the store answered at B's launch: B adopts A's id there
    assert f"resuming run {owner}" in out and run_owner.local_id(b) == owner
    assert (b / ck.FINAL_MODEL).read_bytes() == (ref / ck.FINAL_MODEL).read_bytes()
    assert set(losses(b)) >= set(range(1, 5))  # one MLflow run: A's steps came down with its store
    assert store.get_bytes("latest") == b"step_0000004\n"
    assert json.loads(store.get_bytes(contract.EXIT_STATUS))["exit_code"] == 0


def test_a_store_that_cannot_be_reached_leaves_training_at_exit_0(demo_data, tmp_path, monkeypatch, capsys):
    """Nothing listens on the store's port: one warning at launch and one for the mirror's episode, local
    checkpoints throughout, a last wait that gives up after a few failures, exit 0. In this process, with the
    mirror's backoff between tries cut to milliseconds (the property does not depend on its length)."""
    from x1_pretrain.ckpt import mirror as M

    for k, v in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "AKIAX1",
        "AWS_SECRET_ACCESS_KEY": "x1-unreachable-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(M, "BACKOFF_S", (0.01, 0.02, 0.04))
    monkeypatch.setattr(Store.__init__, "__defaults__", (10.0, 60.0, 1))  # one try a call, not botocore's three
    ckpt = tmp_path / "c"
    code, out = _here(
        train_cmd(demo_data, ckpt, 2, "--ckpt-remote", "s3://x1-runs/down", *NARROW, ckpt_every=1), capsys
    )
    assert code == 0, out[-3000:]
    assert ck.read_latest(ckpt) == "step_0000002" and (ckpt / ck.FINAL_MODEL).is_file()
    assert out.count("WARNING launch.session: the mirror to") == 1
    assert "cannot be reached now" in out and "could not upload" in out
    assert "x1-unreachable-secret" not in out


def test_wrong_credentials_are_exit_2_at_launch_with_the_fix(s3, s3env, demo_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-4242")
    ckpt = tmp_path / "c"
    code, out = _here(train_cmd(demo_data, ckpt, 4, "--ckpt-remote", s3env, seed=False), capsys)
    assert code == 2, out[-3000:]
    assert "refused the credentials" in out and "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in out
    assert "not-the-secret-4242" not in out and "Traceback" not in out
    assert not ckpt.exists()  # nothing was written before the check


def test_a_file_store_goes_up_file_by_file_and_comes_back_whole(s3env, tmp_path, monkeypatch):
    """The lab's --mlflow-uri file:///... store: only the files changed since the last upload go up again, and
    an empty machine gets the whole folder back (renamed into place once complete)."""
    from x1_pretrain.ckpt.mirror import MlflowStore

    store = Store(RemoteURL.parse(s3env))
    mlruns = tmp_path / "mlruns"
    (mlruns / "1" / "run" / "metrics").mkdir(parents=True)
    (mlruns / "1" / "meta.yaml").write_text("name: x1-pretraining\n")
    metric = mlruns / "1" / "run" / "metrics" / "train" / "loss"
    metric.parent.mkdir()
    metric.write_text("1 10.9 1\n")
    calls: list[str] = []
    store.client.meta.events.register(
        "before-parameter-build.s3.PutObject",
        lambda params, **_: calls.append(params["Key"]) if not params["Key"].endswith("/x1-run.json") else None,
    )  # the run's owner object aside
    mirror = Mirror(store, tmp_path / "c", keep_last=3, log=print).start()
    mirror.mlflow(MlflowStore(mlruns, sqlite=False))
    assert mirror.drain(60)
    with open(metric, "a") as f:
        f.write("2 10.7 2\n")
    mirror.mlflow(MlflowStore(mlruns, sqlite=False))
    assert mirror.drain(60)
    mirror.close()
    assert [c.rsplit("/", 1)[-1] for c in calls] == ["meta.yaml", "loss", "loss"] or sorted(
        c.rsplit("/", 1)[-1] for c in calls
    ) == ["loss", "loss", "meta.yaml"]
    back = tmp_path / "machine-b" / "mlruns"
    monkeypatch.setenv("X1_RUN_ID", _proof(tmp_path / "c")["X1_RUN_ID"])
    pull(store, tmp_path / "machine-b" / "c", print, MlflowStore(back, sqlite=False))
    assert (back / "1" / "run" / "metrics" / "train" / "loss").read_text() == "1 10.9 1\n2 10.7 2\n"
    assert (back / "1" / "meta.yaml").read_text() == "name: x1-pretraining\n"


@pytest.mark.slow
def test_a_stop_uploads_its_checkpoint_and_the_watchdog_resumes_on_an_empty_disk(s3env, demo_data, tmp_path):
    """SIGTERM: the stop checkpoint is in the bucket before the process exits 75 (and its exit status); then the
    watchdog, on a machine with nothing local, relaunches the same command and finishes from the bucket."""
    a = tmp_path / "machine-a"
    proc = start(
        train_cmd(demo_data, a, 5, "--ckpt-remote", s3env, *NARROW, ckpt_every=1000),
        tmp_path / "a.log",
        dict(os.environ),
    )
    wait_for(lambda: progress_step(a) >= 2, proc=proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 75
    store = Store(RemoteURL.parse(s3env))
    stopped = ck.read_latest(a)
    assert stopped is not None and store.get_bytes("latest") == f"{stopped}\n".encode()
    assert json.loads(store.get_bytes(contract.EXIT_STATUS))["exit_code"] == 75
    assert "is up to date" in (tmp_path / "a.log").read_text()
    b = tmp_path / "machine-b"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--",
        *train_cmd(
            demo_data, b, 5, "--ckpt-remote", s3env, "--resume-from-latest", *NARROW, ckpt_every=1000, seed=False
        ),
    ]
    out = _run(cmd, {**os.environ, **_proof(a)}, tmp_path / "b.log")
    assert out.returncode == 0, out.stdout[-3000:]
    assert f"{stopped} came down" in out.stdout
    assert min(losses(b)) == 1 and max(losses(b)) == 5  # A's steps (its MLflow copy) and B's, one run
    assert store.get_bytes("latest") == b"step_0000005\n"


def _budget_file(path, machine: str, spent: float) -> str:
    from datetime import datetime, timezone

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(
        json.dumps(
            {
                "spent_usd": spent,
                "rate_usd_per_hr": 1.10,
                "hours_elapsed": 1.0,
                "projected_total_usd": spent + 1.0,
                "last_update_utc": stamp,
                "provider": "runpod",
                "resource_id": machine,
            }
        )
    )
    return str(path)


def test_the_cap_holds_for_the_sum_of_two_machines(s3env, demo_data, tmp_path, monkeypatch, capsys):
    """Machine A spent $20 and was lost; machine B's sidecar counts only B ($16, under the cap alone). Resumed on
    B from the bucket, the ledger brings A's spend along: $36 is over the $35 cap and B does not train."""
    budget = ("--budget-cap-usd", "35", "--budget-alert-usd", "34", "--budget-expected-step-s", "0.01", *NARROW)
    a = tmp_path / "machine-a"
    code, out = _here(
        train_cmd(
            demo_data,
            a,
            2,
            "--ckpt-remote",
            s3env,
            *budget,
            "--budget-curr-cost-uri",
            _budget_file(tmp_path / "a.json", "pod-a", 20.0),
            ckpt_every=2,
        ),
        capsys,
    )
    assert code == 0, out[-3000:]
    b = tmp_path / "machine-b"
    b_json = _budget_file(tmp_path / "b.json", "pod-b", 16.0)
    monkeypatch.setenv("X1_RUN_ID", _proof(a)["X1_RUN_ID"])
    code, out = _here(
        train_cmd(
            demo_data,
            b,
            4,
            "--ckpt-remote",
            s3env,
            "--resume-from-latest",
            *budget,
            "--budget-curr-cost-uri",
            b_json,
            ckpt_every=2,
            seed=False,
        ),
        capsys,
    )
    assert code == 3, out[-3000:]
    assert "the cost ledger came down ($20.0" in out
    assert "spent $36.0" in out and "over the cap $35.00" in out  # $20 on A + $16 on B


def test_the_other_processes_of_a_node_wait_for_the_pull_and_share_its_failure(tmp_path, monkeypatch):
    from x1_pretrain.ckpt.remote_resume import PULLED, pulled_marker, wait_for_pull

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    ckpt = tmp_path / "c"
    with pulled_marker(ckpt, others_wait=True):
        pass
    wait_for_pull(ckpt, print, timeout_s=5)  # this launch's marker: go
    old = (ckpt / PULLED).stat().st_mtime - 3600
    os.utime(ckpt / PULLED, (old, old))  # a marker an earlier launch left: not this one's
    with pytest.raises(RemoteUnavailable, match="did not finish pulling"):
        wait_for_pull(ckpt, print, timeout_s=0.5, every_s=0.05)
    with pytest.raises(RemoteUnavailable), pulled_marker(ckpt, others_wait=True):
        raise RemoteUnavailable("the store is down")
    with pytest.raises(RemoteUnavailable, match="the store is down") as e:
        wait_for_pull(ckpt, print, timeout_s=5)
    assert e.value.exit_code == 1
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the next restart does not take the old verdict
    with pytest.raises(RemoteUnavailable, match="did not finish pulling"):
        wait_for_pull(ckpt, print, timeout_s=0.5, every_s=0.05)


def test_a_second_run_on_an_owned_prefix_is_refused_at_launch_and_nothing_of_the_first_changes(
    s3env, demo_data, tmp_path, capsys
):
    """Run A owns the prefix (its mirror claimed it). Another run pointed there, fresh or with a checkpoint dir
    of its own, is exit 2 naming the prefix, A's run id and the fix, before it writes anything there."""
    from x1_pretrain.ckpt import run_owner

    store = Store(RemoteURL.parse(s3env))
    a = tmp_path / "run-a"
    mirror = Mirror(store, a, keep_last=3, log=print).start()
    mirror.checkpoint(_step(a, 2, mb=0.05))
    assert mirror.drain(60)
    mirror.close()
    owner = run_owner.local_id(a)
    before = {k: store.get_bytes(k) for k in store.list_objects()}
    assert owner and run_owner.OWNER in before
    b = tmp_path / "run-b"
    code, out = _here(train_cmd(demo_data, b, 4, "--ckpt-remote", s3env, ckpt_every=2), capsys)
    assert code == 2, out[-3000:]
    assert f"--ckpt-remote {store.url} belongs to run {owner}" in out, out[-3000:]
    assert "a prefix of its own (another --ckpt-remote)" in out
    assert "--resume-from-latest" in out and "Traceback" not in out
    c = tmp_path / "run-c"  # another experiment's checkpoint dir (its own id), even with --resume-from-latest
    run_owner.keep_local(c, "another-experiment")
    code, out = _here(train_cmd(demo_data, c, 4, "--ckpt-remote", s3env, "--resume-from-latest", ckpt_every=2), capsys)
    assert code == 2, out[-3000:]
    assert f"belongs to run {owner}" in out and "belongs to run another-experiment" in out
    assert {k: store.get_bytes(k) for k in store.list_objects()} == before
    assert not list(b.glob("step_*")) and not list(c.glob("step_*"))


def test_a_pull_adopts_the_prefix_run_and_takes_nothing_into_another_runs_dir(s3env, tmp_path, monkeypatch):
    """The store was down at launch (no check then): the pull itself refuses a checkpoint dir of another run
    (exit 2, nothing downloaded) and gives an empty one the prefix's run id."""
    from x1_pretrain.ckpt import run_owner
    from x1_pretrain.core.errors import X1Error

    store = Store(RemoteURL.parse(s3env))
    src = tmp_path / "machine-a"
    mirror = Mirror(store, src, keep_last=3, log=print).start()
    mirror.checkpoint(_step(src, 3, mb=0.05))
    assert mirror.drain(60)
    mirror.close()
    other = tmp_path / "other-run"
    run_owner.keep_local(other, "another-experiment")
    with pytest.raises(X1Error, match=f"belongs to run {run_owner.local_id(src)}") as e:
        pull(store, other, print)
    assert e.value.exit_code == 2 and not list(other.glob("step_*"))
    empty = tmp_path / "machine-b"
    monkeypatch.setenv("X1_RUN_ID", run_owner.local_id(src))  # its proof of identity (docs/running.md)
    assert pull(store, empty, print) == "step_0000003"
    assert run_owner.local_id(empty) == run_owner.local_id(src)


def _put_raw(store: Store, rel: str, body: bytes) -> None:
    """An object put straight through boto3, the way anyone with write access to the bucket can."""
    store.client.put_object(Bucket=store.url.bucket, Key=store.url.key(rel), Body=body)


@pytest.mark.parametrize(
    "key",
    ["mlruns/../../x1-escaped", "mlruns//tmp/x1-escaped-abs", "mlruns/1/../../..", "mlruns/a\\..\\..\\x1-escaped"],
)
def test_a_hostile_mlflow_key_in_the_bucket_is_refused_and_nothing_is_written(s3env, tmp_path, key):
    from x1_pretrain.ckpt.mirror import MlflowStore

    store = Store(RemoteURL.parse(s3env))
    _put_raw(store, "mlruns/1/meta.yaml", b"name: x1-pretraining\n")
    _put_raw(store, key, b"owned\n")
    assert key in store.list_objects(""), "the store must keep the key as given for this test to mean anything"
    back = tmp_path / "machine-b" / "mlruns"
    with pytest.raises(X1Error, match="would be written outside its folder") as e:
        pull(store, tmp_path / "machine-b" / "c", print, MlflowStore(back, sqlite=False))
    assert f"{key!r}"[1:-1].split("/")[-1] in str(e.value) and "delete it from the bucket" in str(e.value)
    assert not back.exists() and not Path("/tmp/x1-escaped-abs").exists()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [], written


def test_a_hostile_file_name_in_a_remote_checkpoint_is_refused(s3env, tmp_path, monkeypatch):
    store = Store(RemoteURL.parse(s3env))
    src = tmp_path / "a"
    mirror = Mirror(store, src, keep_last=3, log=print).start()
    mirror.checkpoint(_step(src, 4, mb=0.1))
    assert mirror.drain(60)
    mirror.close()
    _put_raw(store, "step_0000004/..", b"owned\n")
    monkeypatch.setenv("X1_RUN_ID", _proof(src)["X1_RUN_ID"])
    with pytest.raises(X1Error, match=r"step_0000004/\.\. names '\.\.' would be written outside its folder"):
        pull(store, tmp_path / "b", print)
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith((".", "step_"))]


@pytest.mark.parametrize(
    "blob",
    [
        b"[1, 2, 3]",
        b"{half a ledger",
        b'"a string"',
        json.dumps({"format": "x1-budget-ledger/1", "memory": {"spent_usd": 1e308 * 10}}).encode(),
    ],
)
def test_a_remote_ledger_that_is_not_one_is_set_aside_with_a_warning_not_a_crash(s3env, tmp_path, blob):
    store = Store(RemoteURL.parse(s3env))
    _put_raw(store, LEDGER_FILE, blob)
    dst = tmp_path / "c"
    dst.mkdir()
    (dst / LEDGER_FILE).write_text(_ledger(2.0))
    lines: list[str] = []
    assert pull(store, dst, lines.append) is None
    assert any("budget warning" in x and "not used" in x for x in lines), lines
    assert json.loads((dst / LEDGER_FILE).read_text())["memory"]["spent_usd"] == 2.0
    (aside,) = dst.glob(f"{LEDGER_FILE}.remote-bad-*")
    assert aside.read_bytes() == blob


def test_a_pulled_ledger_with_a_negative_earlier_bill_cannot_switch_the_cap_off(s3env, tmp_path):
    """The reproduced case: $20 counted here, the sidecar reads $40, the cap is $35: exit-now. A bucket ledger
    that counted "more" ($31) but carries earlier_machines_usd = -100 would make the guard add -100 to every
    reading (an alert at $31 instead of exit-now): it is refused and the guard still says exit-now."""
    from datetime import datetime, timezone

    from x1_pretrain.budget.guard import Action, Limits, Progress, decide, parse
    from x1_pretrain.budget.ledger import memory_from_json, read_memory

    now = datetime(2026, 5, 23, 12, 0, tzinfo=timezone.utc)
    reading = parse(
        {
            "spent_usd": 40.0,
            "rate_usd_per_hr": 1.1,
            "hours_elapsed": 30,
            "projected_total_usd": 41.0,
            "last_update_utc": "2026-05-23T12:00:00Z",
            "machine": "lambda:i-1",
        }
    )
    limits, progress = Limits(35.0, 30.0), Progress(10, 100, None)
    dst = tmp_path / "c"
    dst.mkdir()
    local = {
        "format": "x1-budget-ledger/1",
        "cap_usd": 35.0,
        "memory": {"spent_usd": 20.0, "machine": "lambda:i-1", "earlier_machines_usd": 0.0},
    }
    (dst / LEDGER_FILE).write_text(json.dumps(local))
    before, _ = decide(reading, limits, now, progress, read_memory(dst))
    assert before.action == Action.EXIT_NOW
    hostile = {
        "format": "x1-budget-ledger/1",
        "cap_usd": 35.0,
        "memory": {"spent_usd": 31.0, "machine": "lambda:i-1", "earlier_machines_usd": -100.0},
    }
    assert decide(reading, limits, now, progress, memory_from_json(hostile["memory"]))[0].action == Action.ALERT
    store = Store(RemoteURL.parse(s3env))
    _put_raw(store, LEDGER_FILE, json.dumps(hostile).encode())
    lines: list[str] = []
    pull(store, dst, lines.append)
    assert any("memory.earlier_machines_usd = -100.0" in x for x in lines), lines
    after, _ = decide(reading, limits, now, progress, read_memory(dst))
    assert after.action == Action.EXIT_NOW and after.spent_usd >= 40.0
