"""One ``--ckpt-remote`` prefix, several runs, on a real S3 server (moto on 127.0.0.1): a run never deletes or
overwrites what it did not write. A mirror that finds the prefix another run's (its launch could not check)
stops the run with exit 2; every push under an owned prefix (``remote push``, the terminate's bundle) writes only
as the owner; a resume continues the owner's run only with proof of identity (its checkpoint dir or
``X1_RUN_ID``); ownerless checkpoints are never claimed by a fresh run, at launch or later."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from x1_pretrain import remote
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.ckpt import remote_resume, run_owner
from x1_pretrain.ckpt.mirror import Mirror
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.core import contract
from x1_pretrain.core.contract import EXIT_USAGE
from x1_pretrain.core.errors import X1Error
from x1_pretrain.supervise import terminate
from x1_pretrain.trainer.callbacks import MirrorRefused

from ..procs import REPO, start, train_cmd, wait_for
from ..s3server import Proxy
from .test_mirror import _step


@pytest.fixture(autouse=True)
def _no_given_id(monkeypatch):
    monkeypatch.delenv("X1_RUN_ID", raising=False)  # each test says which run id it gives


def _owned(s3env: str, tmp_path: Path) -> tuple[Store, str, dict[str, bytes | None]]:
    """Run A's mirror claims the prefix and puts step 1 there: (the store, A's id, every object as it is)."""
    store = Store(RemoteURL.parse(s3env))
    a = tmp_path / "run-a"
    mirror = Mirror(store, a, keep_last=3, log=print).start()
    mirror.checkpoint(_step(a, 1, mb=0.05))
    assert mirror.drain(30)
    mirror.close()
    owner = run_owner.local_id(a)
    assert owner and run_owner.remote_id(store) == owner
    return store, owner, _objects(store)


def _objects(store: Store) -> dict[str, bytes | None]:
    return {k: store.get_bytes(k) for k in store.list_objects()}


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "train.log").write_text("a log line\n")
    return path


def test_a_mirror_that_finds_another_owner_writes_nothing_and_stops_the_run_with_the_launch_text(s3env, tmp_path):
    store, owner, before = _owned(s3env, tmp_path)
    b = tmp_path / "run-b"
    run_owner.keep_local(b, "run-b")  # an offline launch made B's id; the store answers only now
    mirror = Mirror(store, b, keep_last=1, log=print).start()
    mirror.checkpoint(_step(b, 2, mb=0.05))
    assert mirror.drain(30)
    mirror.close()
    assert _objects(store) == before and mirror.refused == owner
    assert mirror.refusal == str(run_owner.refusal(store, owner, "run-b"))  # the launch refusal's own words
    assert f"{store.url} belongs to run {owner}" in mirror.refusal and "X1_RUN_ID=" in mirror.refusal
    said: list[str] = []
    run = SimpleNamespace(world=SimpleNamespace(main=True), console=said.append)
    outcome, checkpoint = MirrorRefused(mirror).after_step(run, None, SimpleNamespace(step=7))
    assert (outcome.exit_code, outcome.step, checkpoint) == (EXIT_USAGE, 7, True)  # at this boundary, saved
    assert mirror.refusal in outcome.reason and said == [f"error: {mirror.refusal}"]
    run.world.main = False
    assert MirrorRefused(mirror).after_step(run, None, SimpleNamespace(step=7)) is None  # rank 0 decides


def test_an_offline_fresh_mirror_never_claims_ownerless_checkpoints_but_a_resume_does(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    store.put_bytes(b"done\n", "step_0000004/DONE")  # an older run's mirror, from before run ids
    store.put_bytes(b"step_0000004\n", ck.LATEST)
    before = _objects(store)
    fresh = tmp_path / "fresh"
    assert run_owner.offline(fresh, resume=False)  # the launch could not reach the store
    mirror = Mirror(store, fresh, keep_last=1, log=print).start()
    mirror.checkpoint(_step(fresh, 1, mb=0.05))
    mirror.file(contract.EXIT_STATUS)
    assert mirror.drain(30)
    mirror.close()
    assert _objects(store) == before  # no owner claimed, latest and step 4 untouched
    assert "already holds checkpoints (step_0000004) but no x1-run.json" in str(mirror.refusal)
    resumed = tmp_path / "resumed"
    mirror = Mirror(store, resumed, keep_last=3, log=print)
    mirror.resume = True  # --resume-from-latest continues that run
    mirror.start().checkpoint(_step(resumed, 5, mb=0.05))
    assert mirror.drain(30)
    mirror.close()
    assert mirror.refusal is None and run_owner.remote_id(store) == mirror.run_id == run_owner.local_id(resumed)
    assert store.get_bytes(ck.LATEST) == b"step_0000005\n"


def test_a_resume_on_an_empty_disk_needs_the_owners_id(s3env, tmp_path, monkeypatch):
    store, owner, before = _owned(s3env, tmp_path)
    with pytest.raises(X1Error) as e:  # a teammate's new job with the recipe's --resume-from-latest
        run_owner.settle(store, tmp_path / "teammate", resume=True, log=print)
    assert e.value.exit_code == 2 and f"X1_RUN_ID={owner}" in str(e.value) and "another --ckpt-remote" in str(e.value)
    assert not (tmp_path / "teammate").exists()
    with pytest.raises(X1Error, match=f"X1_RUN_ID={owner}"):  # nor does the pull after an offline launch adopt
        remote_resume.pull(store, tmp_path / "teammate2", print)
    assert not list((tmp_path / "teammate2").glob("step_*"))
    monkeypatch.setenv("X1_RUN_ID", "someone-else")
    with pytest.raises(X1Error, match=f"belongs to run {owner}"):
        run_owner.settle(store, tmp_path / "teammate3", resume=True, log=print)
    monkeypatch.setenv("X1_RUN_ID", owner)  # the same managed job on a new VM: proof given
    assert run_owner.settle(store, tmp_path / "recovered", resume=True, log=print) == owner
    assert run_owner.local_id(tmp_path / "recovered") == owner
    assert remote_resume.pull(store, tmp_path / "recovered2", print) == "step_0000001"
    assert _objects(store) == before
    with pytest.raises(X1Error, match=r"X1_RUN_ID=.* but .* belongs to run run-c"):  # proof that contradicts
        run_owner.keep_local(tmp_path / "c", "run-c")
        run_owner.settle(store, tmp_path / "c", resume=True, log=print)


def test_a_fresh_run_given_an_id_uses_it_and_a_bad_one_is_refused(s3env, tmp_path, monkeypatch):
    store = Store(RemoteURL.parse(s3env))
    monkeypatch.setenv("X1_RUN_ID", "sky-managed-2026-12-07_x1-lab00_1")
    assert run_owner.offline(tmp_path / "a", resume=True) == "sky-managed-2026-12-07_x1-lab00_1"
    assert run_owner.settle(store, tmp_path / "b", resume=False, log=print) == "sky-managed-2026-12-07_x1-lab00_1"
    assert run_owner.remote_id(store) == run_owner.local_id(tmp_path / "b") == "sky-managed-2026-12-07_x1-lab00_1"
    monkeypatch.setenv("X1_RUN_ID", "../x")
    with pytest.raises(X1Error, match=r"X1_RUN_ID='\.\./x' is not a run id"):
        run_owner.settle(store, tmp_path / "c", resume=False, log=print)


def test_remote_push_into_an_owned_prefix_writes_only_as_its_owner(s3env, tmp_path, monkeypatch, capsys):
    store, owner, before = _owned(s3env, tmp_path)
    logs = _folder(tmp_path / "logs")
    dest = f"{s3env}/logs"
    assert remote.main(["push", str(logs), dest]) == 2  # no run id at all
    assert "belongs to run " + owner in capsys.readouterr().err
    run_owner.keep_local(tmp_path / "run-b", "run-b")
    assert remote.main(["push", "--run-dir", str(tmp_path / "run-b"), str(logs), dest]) == 2
    err = capsys.readouterr().err
    assert f"is inside {store.url}, which belongs to run {owner}" in err and "this run is run-b" in err
    monkeypatch.setenv("X1_RUN_ID", "run-b")
    assert remote.main(["push", str(logs), dest]) == 2
    assert _objects(store) == before  # nothing written by any of them
    assert remote.main(["push", "--run-dir", str(tmp_path / "run-a"), "--verify", str(logs), dest]) == 0
    monkeypatch.setenv("X1_RUN_ID", owner)
    assert remote.main(["push", str(logs), f"{s3env}/hf/x1-50m"]) == 0
    assert {"logs/train.log", "hf/x1-50m/train.log"} <= set(store.list_objects())
    monkeypatch.delenv("X1_RUN_ID")
    assert remote.main(["push", str(logs), f"{s3env}-elsewhere/logs"]) == 0  # an unowned prefix: as before


def test_the_terminate_bundle_push_refuses_another_runs_prefix(s3env, tmp_path):
    store, owner, before = _owned(s3env, tmp_path)
    bundle = _folder(tmp_path / "bundle")
    final = _step(tmp_path / "run-b-ckpt", 3, mb=0.05)
    run_owner.keep_local(tmp_path / "run-b-ckpt", "run-b")
    end = terminate.EndOfBill(
        source=None, export_to=bundle, mlflow_uri="", bundle_remote=f"{s3env}/bundle", run_dir=tmp_path / "run-b-ckpt"
    )
    lines: list[str] = []
    missing = terminate.offload(end, final, lines.append)
    assert len(missing) == 2 and f"belongs to run {owner}" in missing[0] and "nothing was written" in missing[0]
    assert any(x.startswith("error: ") for x in lines) and _objects(store) == before
    mine = terminate.EndOfBill(
        source=None, export_to=bundle, mlflow_uri="", bundle_remote=f"{s3env}/bundle", run_dir=tmp_path / "run-a"
    )
    assert terminate.offload(mine, final, print) == []
    assert "bundle/train.log" in store.list_objects() and "bundle/checkpoint/DONE" in store.list_objects()


def test_the_recipe_gives_every_push_the_run_and_keeps_the_id_across_recoveries():
    task = yaml.safe_load((REPO / "deploy" / "skypilot.yaml").read_text())
    run = task["run"]
    assert "X1_RUN_ID" in task["envs"]
    assert 'X1_RUN_ID="${SKYPILOT_TASK_ID:-}"' in run and "export X1_RUN_ID" in run
    pushes = [line for line in run.splitlines() if "x1_pretrain.remote push" in line]
    assert len(pushes) == 3 and all("--run-dir /workspace/checkpoints" in line for line in pushes)
    script = (
        'X1_RUN_ID=""; '
        + run.split("push_dir() {")[0].split('remote="${X1_CKPT_REMOTE%/}"')[1]
        + ' echo "id=$X1_RUN_ID"'
    )
    env = {**os.environ, "SKYPILOT_TASK_ID": "sky-managed-7_x1-lab00_1-0"}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=10)
    assert out.stdout.strip() == "id=sky-managed-7_x1-lab00_1-0", out.stderr


@pytest.mark.slow
def test_a_trainer_launched_offline_on_another_runs_prefix_ends_with_exit_2(s3, s3env, demo_data, tmp_path):
    """The store is down at B's launch (a warning), comes back, and B's mirror finds A's prefix: B ends with exit
    2 and the refusal (at the next step boundary, or at its end if it finished first), A's objects untouched."""
    store, owner, before = _owned(s3env, tmp_path)
    proxy = Proxy(s3.port, listening=False)
    b, log = tmp_path / "run-b", tmp_path / "b.log"
    try:
        proc = start(
            train_cmd(demo_data, b, 6, "--ckpt-remote", s3env, ckpt_every=2),
            log,
            {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint},
        )
        wait_for(lambda: "cannot be reached" in log.read_text(), proc=proc, timeout=60)
        proxy.listen()
        assert proc.wait(120) == 2, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.close()
    text = log.read_text()
    assert f"--ckpt-remote {store.url} belongs to run {owner}" in text and "Traceback" not in text
    assert ck.read_latest(b) is not None  # a checkpoint kept locally
    assert _objects(store) == before
