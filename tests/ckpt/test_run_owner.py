"""Who owns a --ckpt-remote prefix, against a real S3 server (moto's) on 127.0.0.1: the launch's verdicts (the
same run goes on, a resume on an empty disk adopts, any other run is exit 2 naming the owner and the fix) and a
conditional create that two runs cannot both win."""

from __future__ import annotations

import threading

import pytest

from x1_pretrain.ckpt import run_owner
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.core.errors import X1Error


def test_a_fresh_run_claims_an_empty_prefix_and_its_relaunch_goes_on(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    lines: list[str] = []
    run_id = run_owner.settle(store, tmp_path / "a", resume=False, log=lines.append)
    assert run_owner.remote_id(store) == run_id == run_owner.local_id(tmp_path / "a")
    assert any(f"belongs to run {run_id}" in x for x in lines)
    assert run_owner.settle(store, tmp_path / "a", resume=False, log=print) == run_id  # a relaunch
    assert run_owner.settle(store, tmp_path / "a", resume=True, log=print) == run_id  # a resume on this disk


def test_another_run_is_refused_and_a_resume_on_an_empty_disk_adopts(s3env, tmp_path, monkeypatch):
    store = Store(RemoteURL.parse(s3env))
    owner = run_owner.settle(store, tmp_path / "a", resume=False, log=print)
    with pytest.raises(X1Error) as e:  # a fresh --ckpt-dir, another experiment
        run_owner.settle(store, tmp_path / "b", resume=False, log=print)
    text = str(e.value)
    assert e.value.exit_code == 2 and str(store.url) in text and f"belongs to run {owner}" in text
    assert "another --ckpt-remote" in text and "--resume-from-latest" in text
    assert not (tmp_path / "b").exists()  # nothing written for a run that does not start
    run_owner.keep_local(tmp_path / "c", "run-c")
    with pytest.raises(X1Error, match="this --ckpt-dir belongs to run run-c"):  # even as a resume
        run_owner.settle(store, tmp_path / "c", resume=True, log=print)
    lines: list[str] = []
    monkeypatch.setenv("X1_RUN_ID", owner)  # its proof of identity (docs/running.md)
    assert run_owner.settle(store, tmp_path / "d", resume=True, log=lines.append) == owner  # a new machine
    assert run_owner.local_id(tmp_path / "d") == owner and any("adopts its id" in x for x in lines)
    assert run_owner.remote_id(store) == owner


def test_checkpoints_without_an_owner_are_refused_to_a_fresh_run_and_claimed_by_a_resume(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    store.put_bytes(b"done", "step_0000004/DONE")  # a mirror from before run ids
    with pytest.raises(X1Error, match=r"already holds checkpoints \(step_0000004\) but no x1-run.json"):
        run_owner.settle(store, tmp_path / "a", resume=False, log=print)
    assert run_owner.remote_id(store) is None
    run_id = run_owner.settle(store, tmp_path / "b", resume=True, log=print)
    assert run_owner.remote_id(store) == run_id == run_owner.local_id(tmp_path / "b")


def test_an_unreachable_launch_keeps_or_makes_the_id_but_a_resume_waits_to_adopt(tmp_path):
    run_id = run_owner.offline(tmp_path / "a", resume=False)
    assert run_id and run_owner.local_id(tmp_path / "a") == run_id
    assert run_owner.offline(tmp_path / "a", resume=True) == run_id
    assert run_owner.offline(tmp_path / "b", resume=True) is None and not (tmp_path / "b").exists()


def test_two_runs_claiming_one_prefix_at_once_cannot_both_win(s3env):
    """The owner object is created with If-None-Match: *: of runs claiming together, exactly one owns the prefix
    and every claimant is told the same owner."""
    store = Store(RemoteURL.parse(s3env))
    go = threading.Barrier(4)
    won: dict[str, str] = {}

    def claim(run_id: str) -> None:
        mine = Store(RemoteURL.parse(s3env))
        go.wait()
        won[run_id] = run_owner.claim(mine, run_id)

    threads = [threading.Thread(target=claim, args=(f"run-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 4 and len(set(won.values())) == 1
    assert run_owner.remote_id(store) == next(iter(won.values()))
