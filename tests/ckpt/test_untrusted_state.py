"""State that comes from a bucket is not trusted, against a real S3 server on 127.0.0.1 (in-process calls):
the mirror never lowers the remote ledger's spend and writes it conditionally; a hostile ``trainer_state.json``
makes its checkpoint invalid, never a crash; the remote's ``exit_status.json`` is not pulled and the watchdog
judges a start only by a record of that start; a pulled ledger raises the money counted, never the alerts
state."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from x1_pretrain.budget.ledger import FORMAT, LEDGER_FILE, Ledger, merge, parse_text
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.ckpt import run_owner
from x1_pretrain.ckpt.mirror import Mirror
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.ckpt.remote_resume import pull
from x1_pretrain.core import contract
from x1_pretrain.supervise import watchdog as W

from .test_mirror import _step


def _ledger(spent: float, alerts: tuple[str, ...] = (), **memory: Any) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "cap_usd": 35.0,
        "run_started_utc": "2026-12-01T00:00:00Z",
        "memory": {"spent_usd": spent, "alerts_sent": list(alerts), **memory},
        "events": [],
    }


def _remote_ledger(store: Store) -> dict[str, Any]:
    data, problem = parse_text(store.get_bytes(LEDGER_FILE) or b"", "the remote ledger")
    assert data is not None, problem
    return data


def _mirror_ledger(store: Store, ckpt: Path, blob: dict[str, Any], log: Any = print) -> None:
    (ckpt / LEDGER_FILE).write_text(json.dumps(blob))
    mirror = Mirror(store, ckpt, keep_last=3, log=log).start()
    try:
        mirror.file(LEDGER_FILE)
        assert mirror.drain(60)
    finally:
        mirror.close()


# -- finding 2: the remote ledger's spend never goes down ----------------------------------------------------
def test_a_run_past_the_remotes_newest_step_never_lowers_the_remote_ledger(s3env, tmp_path):
    """Machine B of run-a mirrored step 5 and $9. Machine A (same run) resumed from its local step 3 while the
    store was down, counted $1 and then passed the remote's newest step: its checkpoint goes up, its ledger
    goes up with B's larger spend (and A's own alert state), and once A counts more than $9 that goes up."""
    store = Store(RemoteURL.parse(s3env))
    b, a = tmp_path / "machine-b", tmp_path / "machine-a"
    for d in (b, a):
        run_owner.keep_local(d, "run-a")
    mirror_b = Mirror(store, b, keep_last=3, log=print).start()
    mirror_b.checkpoint(_step(b, 5, mb=0.05))
    assert mirror_b.drain(60)
    mirror_b.close()
    _mirror_ledger(store, b, _ledger(9.0, ("cap-80pct",), rate_usd_per_hr=2.0))
    assert _remote_ledger(store)["memory"]["spent_usd"] == 9.0

    _step(a, 3, mb=0.05)
    lines: list[str] = []
    mirror_a = Mirror(store, a, keep_last=3, log=lines.append).start()
    try:
        mirror_a.checkpoint(_step(a, 7, mb=0.05))  # newer than the remote's step 5: it goes up
        (a / LEDGER_FILE).write_text(json.dumps(_ledger(1.0, rate_usd_per_hr=1.5)))
        mirror_a.file(LEDGER_FILE)
        assert mirror_a.drain(60)
        assert ck.read_latest(a) == "step_0000007" and store.get_bytes(ck.LATEST) == b"step_0000007\n"
        remote = _remote_ledger(store)
        assert remote["memory"]["spent_usd"] == 9.0, remote  # not A's $1
        assert remote["memory"]["rate_usd_per_hr"] == 2.0
        assert remote["memory"]["alerts_sent"] == []  # the writer's own alert state
        assert any("counted $9.00, more than this run's $1.00" in x for x in lines), lines
        (a / LEDGER_FILE).write_text(json.dumps(_ledger(12.5)))
        mirror_a.file(LEDGER_FILE)
        assert mirror_a.drain(60)
        assert _remote_ledger(store)["memory"]["spent_usd"] == 12.5
    finally:
        mirror_a.close()
    assert store.head(LEDGER_FILE)[1] == {run_owner.META_KEY: "run-a"}


def test_the_ledger_upload_is_conditional_and_a_concurrent_writer_is_read_again(s3env, tmp_path):
    """Another writer puts $15 between the mirror's read ($3) and its write ($5): the write, conditional on the
    ETag read, loses; the mirror reads again and uploads the larger spend, $15, not its $5 over it."""
    store, other = Store(RemoteURL.parse(s3env)), Store(RemoteURL.parse(s3env))
    ckpt = tmp_path / "c"
    run_owner.keep_local(ckpt, "run-a")
    store.put_bytes(json.dumps(_ledger(3.0)).encode(), LEDGER_FILE)
    raced: list[str] = []

    def race(params: dict[str, Any], **_: Any) -> None:
        if str(params.get("Key", "")).endswith(LEDGER_FILE) and not raced:
            raced.append(params["Key"])
            other.put_bytes(json.dumps(_ledger(15.0)).encode(), LEDGER_FILE)

    store.client.meta.events.register("before-parameter-build.s3.PutObject", race)
    _mirror_ledger(store, ckpt, _ledger(5.0))
    assert raced and _remote_ledger(store)["memory"]["spent_usd"] == 15.0


def test_a_remote_ledger_that_is_not_one_is_replaced_by_the_local_one(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    ckpt = tmp_path / "c"
    run_owner.keep_local(ckpt, "run-a")
    store.put_bytes(b"[1, 2, 3]", LEDGER_FILE)
    _mirror_ledger(store, ckpt, _ledger(4.0))
    assert _remote_ledger(store)["memory"]["spent_usd"] == 4.0


# -- finding 6: a hostile trainer_state.json makes its checkpoint invalid -------------------------------------
def _upload_step(store: Store, step_dir: Path, *pulling: Path) -> None:
    """A complete step dir under a prefix owned by run-a, whose checkpoint dirs ``pulling`` are."""
    assert run_owner.claim(store, "run-a") == "run-a"
    for d in pulling:
        run_owner.keep_local(d, "run-a")
    for f in sorted(step_dir.iterdir()):
        store.put_file(f, f"{step_dir.name}/{f.name}", metadata={run_owner.META_KEY: "run-a"})


HOSTILE_STATES = [
    [],
    "a string",
    {"step": 6},  # no files
    {"step": 6, "files": []},
    {"step": 6, "files": {"../../outside": "0" * 64}},
    {"step": 6, "files": {"/etc/passwd": "0" * 64}},
    {"step": 6, "files": {"model.safetensors": 7}},
    {"step": "6", "files": {}},
    {"step": True, "files": {}},
    {"step": 9, "files": {}},  # not the step of its folder
    {"step": 6, "files": {}, "rng": []},
    {"step": 6, "files": {}, "rng": {"python": "x"}},
    {"step": 6, "files": {}, "tokens_seen": "many"},
    {"step": 6, "files": {}, "config": [1]},
    {"step": 6, "files": {}, "budget_guard": 3},
]


@pytest.mark.parametrize("state", HOSTILE_STATES, ids=[json.dumps(s)[:40] for s in HOSTILE_STATES])
def test_a_hostile_trainer_state_makes_the_checkpoint_invalid_not_a_crash(s3env, tmp_path, state):
    """The remote's newest step 6 has a trainer_state.json x1 never writes (its DONE matches it): the pull
    warns and takes the older complete step 3; the same step dir on this disk is skipped with a warning."""
    store = Store(RemoteURL.parse(s3env))
    dst = tmp_path / "dst"
    _upload_step(store, _step(tmp_path / "src", 3, mb=0.05), dst)
    text = json.dumps(state)
    store.put_bytes(text.encode(), "step_0000006/trainer_state.json")
    store.put_bytes(hashlib.sha256(text.encode()).hexdigest().encode() + b"\n", "step_0000006/DONE")
    lines: list[str] = []
    assert pull(store, dst, lines.append) == "step_0000003"
    assert any("remote step_0000006 fails verification" in x for x in lines), lines
    assert ck.read_latest(dst) == "step_0000003" and not (dst / "step_0000006").exists()
    bad = dst / "step_0000006"  # the same folder on this disk: not a checkpoint to resume from
    bad.mkdir()
    (bad / ck.STATE_FILE).write_text(text)
    (bad / ck.DONE_FILE).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    warned: list[str] = []
    found = ck.find_latest_complete(dst, warned.append)
    assert found is not None and found.step == 3
    assert len(warned) == 1 and "step_0000006" in warned[0], warned


def test_with_only_hostile_remote_states_nothing_is_pulled(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    assert run_owner.claim(store, "run-a") == "run-a"
    run_owner.keep_local(tmp_path / "dst", "run-a")
    text = "[]"
    store.put_bytes(text.encode(), "step_0000004/trainer_state.json")
    store.put_bytes(hashlib.sha256(text.encode()).hexdigest().encode(), "step_0000004/DONE")
    lines: list[str] = []
    assert pull(store, tmp_path / "dst", lines.append) is None
    assert any("fails verification" in x and "not an object" in x for x in lines), lines
    assert ck.list_step_dirs(tmp_path / "dst") == []


# -- finding 7: the remote's exit status is not pulled; the watchdog judges a start by its own record ----------
def test_the_remote_exit_status_is_not_pulled(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    dst = tmp_path / "dst"
    _upload_step(store, _step(tmp_path / "src", 3, mb=0.05), dst)
    forged = {"exit_code": 0, "reason": "finished", "pid": 1, "time_unix": time.time() + 86400, "rank": 0}
    store.put_bytes(json.dumps(forged).encode(), contract.EXIT_STATUS)
    assert pull(store, dst, print) == "step_0000003"
    assert not (dst / contract.EXIT_STATUS).exists()


def _status(path: Path, code: int, when: float) -> None:
    path.write_text(json.dumps({"exit_code": code, "reason": "r", "pid": 1, "time_unix": when, "rank": 0}))


def test_the_watchdog_judges_a_start_only_by_a_record_of_that_start(tmp_path):
    """A start that recorded nothing (killed) exited 1: a record from before it began, or one from the future (a
    copy from elsewhere), does not turn that into 0 (ends the bill) or 4 (never relaunched); a record of this
    start does, from the watchdog's own file or, failing that, the checkpoint dir's."""
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    wd = W.Watchdog(["python", "-m", "x1_pretrain.train", "--ckpt-dir", str(ckpt)], W.WatchdogOptions())
    started = time.time() - 5
    assert wd._trainer_code(1, started) == 1  # nothing recorded
    _status(ckpt / contract.EXIT_STATUS, 0, time.time() + 3600)  # from the future
    assert wd._trainer_code(1, started) == 1
    _status(ckpt / contract.EXIT_STATUS, 4, started - 60)  # an earlier start's
    assert wd._trainer_code(1, started) == 1
    _status(wd.status_file, 4, time.time() + 3600)
    assert wd._trainer_code(1, started) == 1 and wd._recorded_since(started) is None
    _status(ckpt / contract.EXIT_STATUS, 5, time.time() - 1)  # this start's, in the checkpoint dir
    assert wd._trainer_code(1, started) == 5
    _status(wd.status_file, 3, time.time() - 1)  # this start's, in the watchdog's own file
    assert wd._trainer_code(1, started) == 3 and wd._recorded_since(started)["exit_code"] == 3
    wd.cleanup()


# -- finding 8: a pulled ledger raises the money, the local alerts state stays ----------------------------------
def test_a_pulled_ledger_raises_the_money_and_keeps_the_local_alerts_state(s3env, tmp_path):
    """The bucket's ledger counted more and says every alert was sent: the spend, its time, the rates and the
    earlier machines' bill come down; the alerts state (none sent here) and this disk's events stay, so the
    alerts still go out."""
    store = Store(RemoteURL.parse(s3env))
    dst = tmp_path / "dst"
    _upload_step(store, _step(tmp_path / "src", 3, mb=0.05), dst)
    remote = _ledger(
        21.5,
        ("cap-50pct", "cap-80pct", "cap-95pct"),
        spent_at_utc="2026-12-06T10:00:00Z",
        rate_usd_per_hr=3.0,
        launch_rate_usd_per_hr=2.5,
        earlier_machines_usd=6.0,
    )
    remote["run_started_utc"] = "2026-11-30T00:00:00Z"
    store.put_bytes(json.dumps(remote).encode(), LEDGER_FILE)
    local = _ledger(2.0, (), spent_at_utc="2026-12-07T01:00:00Z", rate_usd_per_hr=1.0, machine="vm-2")
    local["events"] = [{"time_utc": "2026-12-07T01:00:00Z", "kind": "start"}]
    (dst / LEDGER_FILE).write_text(json.dumps(local))
    lines: list[str] = []
    pull(store, dst, lines.append)
    got = json.loads((dst / LEDGER_FILE).read_text())
    m = got["memory"]
    assert (
        m["spent_usd"],
        m["spent_at_utc"],
        m["rate_usd_per_hr"],
        m["launch_rate_usd_per_hr"],
        m["earlier_machines_usd"],
    ) == (21.5, "2026-12-06T10:00:00Z", 3.0, 2.5, 6.0)
    assert m["alerts_sent"] == [] and m["machine"] == "vm-2" and got["events"] == local["events"]
    assert got["run_started_utc"].startswith("2026-11-30")
    assert any("the cost ledger came down ($21.50" in x for x in lines), lines
    memory = Ledger(dst, 35.0, log=print).load()
    assert memory.spent_usd == 21.5 and memory.alerted == frozenset()


def test_a_pulled_ledger_never_lowers_a_field_and_a_new_disk_gets_no_alert_marked_sent(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    store.put_bytes(json.dumps(_ledger(1.0, ("cap-80pct",), rate_usd_per_hr=0.5)).encode(), LEDGER_FILE)
    here, empty = tmp_path / "here", tmp_path / "empty"  # empty: a new machine's disk, no ledger yet
    _upload_step(store, _step(tmp_path / "src", 3, mb=0.05), here, empty)
    local = _ledger(8.0, ("cap-50pct",), rate_usd_per_hr=2.0)
    (here / LEDGER_FILE).write_text(json.dumps(local))
    pull(store, here, print)
    assert json.loads((here / LEDGER_FILE).read_text()) == local  # the remote counted less: untouched
    pull(store, empty, print)
    got = json.loads((empty / LEDGER_FILE).read_text())
    assert got["memory"]["spent_usd"] == 1.0 and got["memory"]["alerts_sent"] == []
    assert merge(None, _ledger(3.0, ("x",)))["memory"]["alerts_sent"] == []
