"""The checkpoint mirror against a real S3 server (moto's) on 127.0.0.1: the order that keeps the remote
readable, keep_last remotely, a store that is down, and a mirror SIGKILLed at random moments of an upload."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.ckpt import run_owner
from x1_pretrain.ckpt.mirror import STAGING, Mirror
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.core import contract

from ..conftest import REPO
from ..procs import children
from ..s3server import Proxy
from ..servers import wait_until


def _step(ckpt: Path, step: int, mb: float = 0.5) -> Path:
    g = torch.Generator().manual_seed(step)
    n = int(mb * 1e6 / 4)
    snap = ck.StepSnapshot(
        step,
        {"w": torch.randn(n, generator=g)},
        {"state": {}, "param_groups": []},
        {"step": step, "rng": ck.rng_state()},
    )
    return ck.write_step_dir(ckpt, snap)[0]


def _remote_complete(store: Store, tmp: Path) -> str | None:
    """What the remote ``latest`` names, downloaded and verified like a resume does (None: no latest yet)."""
    raw = store.get_bytes(ck.LATEST)
    if raw is None:
        return None
    name = raw.decode().strip()
    back = tmp / f"check-{name}-{random.random()}"
    back.mkdir()
    for rel in store.list_objects(name + "/"):
        store.get_file(rel, back / rel.split("/", 1)[1])
    state, problem = ck.verify(back)
    assert state is not None, f"the remote latest {name} is not complete: {problem}"
    return name


def test_a_checkpoint_goes_up_files_first_then_done_then_latest(s3env, tmp_path):
    store = Store(RemoteURL.parse(s3env))
    calls: list[tuple[str, str]] = []
    store.client.meta.events.register(
        "before-parameter-build.s3.*", lambda params, model, **_: calls.append((model.name, params.get("Key", "")))
    )
    path = _step(tmp_path / "c", 5)
    mirror = Mirror(store, tmp_path / "c", keep_last=3, log=print).start()
    mirror.checkpoint(path)
    assert mirror.drain(60)
    mirror.close()
    assert next(c for c in calls if c[0] not in ("GetObject", "ListObjectsV2")) == (
        "PutObject",
        f"{RemoteURL.parse(s3env).prefix}/x1-run.json",
    )  # the owner, before all
    calls = [c for c in calls if not c[1].endswith("/x1-run.json")]
    puts = [k.rsplit("/", 2)[-2:] for op, k in calls if op in ("PutObject", "CreateMultipartUpload")]
    writes = [op for op, _ in calls if op not in ("GetObject", "ListObjectsV2", "ListMultipartUploads", "HeadObject")]
    assert writes[0] == "DeleteObjects"  # the step's old DONE first: a rewritten step is incomplete until done
    assert [p[-1] for p in puts] == [
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
        "DONE",
        "latest",
    ]
    assert _remote_complete(store, tmp_path) == "step_0000005"
    prefix = RemoteURL.parse(s3env).prefix
    assert store.get_bytes("step_0000005/model.safetensors") == (path / "model.safetensors").read_bytes()
    assert not any((tmp_path / "c" / STAGING).iterdir())  # the staged links are gone once uploaded
    assert all(k.startswith(prefix + "/") for k in [k for _, k in calls if k])


def test_keep_last_holds_remotely_and_pinned_checkpoints_stay(s3env, tmp_path):
    """keep_last holds remotely, pinned steps stay, this run's incomplete uploads go; what this run did not write
    (no id of its own on it) is never deleted nor written over, even under a step name this run uses."""
    store = Store(RemoteURL.parse(s3env))
    ckpt = tmp_path / "c"
    run_owner.keep_local(ckpt, "run-a")
    store.put_bytes(b"half", "step_0000002/model.safetensors", metadata={"x1-run": "run-a"})  # a killed upload
    store.put_bytes(b"not ours", "step_0000003/model.safetensors")  # written by no run of ours: it stays
    mirror = Mirror(store, ckpt, keep_last=2, log=print).start()
    for step in (1, 3, 4, 5):
        path = _step(ckpt, step, mb=0.1)
        if step == 1:
            (path / ck.PIN_FILE).write_text("keep\n")
        mirror.checkpoint(path)
        assert mirror.drain(60)
    mirror.close()
    dirs = {k.split("/")[0] for k in store.list_objects("step_")}
    assert dirs == {"step_0000001", "step_0000003", "step_0000004", "step_0000005"}
    assert store.list_objects("step_0000003/") == {"step_0000003/model.safetensors": 8}
    assert store.get_bytes("step_0000003/model.safetensors") == b"not ours"
    assert _remote_complete(store, tmp_path) == "step_0000005"
    assert store.head("step_0000005/DONE")[1] == {"x1-run": "run-a"}


def test_a_store_that_is_down_warns_once_alerts_once_and_catches_up(s3, s3env, tmp_path):
    proxy = Proxy(s3.port)
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # monkeypatched by s3env: undone after the test
    store = Store(RemoteURL.parse(s3env), connect_timeout_s=2, read_timeout_s=5, attempts=1)
    lines: list[str] = []
    alerts: list[str] = []
    waits: list[float] = []

    def sleep(s: float) -> None:  # the backoff, without the wall clock: the store comes back after 4 failures
        waits.append(s)
        if len(waits) == 4:
            proxy.refusing = False

    proxy.refusing = True
    mirror = Mirror(
        store, tmp_path / "c", keep_last=3, log=lines.append, alert=lambda s, b: alerts.append(s), sleep=sleep
    ).start()
    try:
        mirror.checkpoint(_step(tmp_path / "c", 1, mb=0.1))
        mirror.checkpoint(_step(tmp_path / "c", 2, mb=0.1))  # while down: replaces step 1 if not started
        mirror.file(contract.EXIT_STATUS)
        assert wait_until(lambda: not mirror.pending() and mirror.failing == 0, timeout=60)
    finally:
        mirror.close()
        proxy.close()
    assert waits == [2.0, 4.0, 8.0, 16.0]
    warnings = [x for x in lines if x.startswith("WARNING")]
    assert len(warnings) == 1 and "retried with backoff" in warnings[0]
    assert alerts == [f"x1 checkpoint mirror failing ({store.url})", f"x1 checkpoint mirror recovered ({store.url})"]
    assert any("caught up after 4 failed attempt(s)" in x for x in lines)
    os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
    assert _remote_complete(Store(RemoteURL.parse(s3env)), tmp_path) == "step_0000002"


CHILD = """
import sys
from pathlib import Path
from x1_pretrain.ckpt.objstore import RemoteURL, Store
from x1_pretrain.ckpt.mirror import Mirror
ckpt, url = Path(sys.argv[1]), sys.argv[2]
mirror = Mirror(Store(RemoteURL.parse(url)), ckpt, keep_last=2, log=print, upload_process=True).start()
for name in sys.argv[3:]:
    mirror.checkpoint(ckpt / name)
    mirror.drain(600)
print("all uploaded", flush=True)
"""


def test_the_remote_latest_is_complete_whenever_the_mirror_is_killed(s3, s3env, tmp_path):
    """SIGKILL at moments drawn at random inside the uploads (by bytes sent, not by the clock): the remote's
    latest always names a checkpoint whose every file is there and verifies. (A kill over an earlier run's
    uploads, then a resume: test_remote_resume's killed-mid-upload test.)"""
    ckpt = tmp_path / "c"
    names = [_step(ckpt, s, mb=1.5).name for s in (1, 2, 3)]  # each weights file goes up from the upload worker
    proxy = Proxy(s3.port)
    store = Store(RemoteURL.parse(s3env))
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint, "PYTHONPATH": str(REPO / "src")}
    rng = random.Random(1234)
    seen = set()
    total = sum(f.stat().st_size for name in names for f in (ckpt / name).iterdir())
    try:
        for attempt in range(4):
            # each attempt from an empty prefix, so the cut drawn below is always inside what it sends (over an
            # earlier attempt's checkpoints the mirror sends only the newer ones: a late cut was never reached)
            store.delete(list(store.list_objects()))
            start = proxy.bytes_up
            cut = rng.uniform(0.05, 0.95) * total  # somewhere in the three checkpoints' bytes
            child = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(ckpt), s3env, *names],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            reached = wait_until(
                lambda s=start, c=cut, p=child: proxy.bytes_up - s >= c or p.poll() is not None, timeout=120
            )
            workers = children(child.pid)
            assert child.poll() is None, f"attempt {attempt}: the uploads ended before the cut"
            child.send_signal(signal.SIGKILL)
            child.wait()
            assert reached, f"attempt {attempt}: the upload did not progress"
            # the upload worker dies with the trainer: no upload outlives the process that asked for it
            assert workers, "the upload worker had not started: the cut came before any large file"
            assert wait_until(lambda w=workers: not any(_alive(p) for p in w), timeout=60)
            seen.add(_remote_complete(store, tmp_path))
    finally:
        proxy.close()
    assert seen - {None}, "no kill left a complete checkpoint behind: the cuts were all too early"


def _alive(pid: int) -> bool:
    """Running, not gone and not a zombie waiting for whoever adopted it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_large_files_go_up_from_a_child_process_that_survives_group_signals_and_is_restarted(s3env, tmp_path):
    """In the trainer's mode the weights go up from the niced upload worker: a SIGTERM sent to it (as a
    preemption sends to the whole process group) does not end it, and a worker that died is started again
    for the next checkpoint."""
    store = Store(RemoteURL.parse(s3env))
    ckpt = tmp_path / "c"
    lines: list[str] = []
    mirror = Mirror(store, ckpt, keep_last=3, log=lines.append, upload_process=True).start()
    try:
        mirror.checkpoint(_step(ckpt, 1, mb=2.0))
        assert mirror.drain(60)
        assert mirror._uploader is not None and mirror._uploader.proc is not None
        worker = mirror._uploader.proc
        assert worker.pid != os.getpid() and worker.poll() is None
        assert os.getpriority(os.PRIO_PROCESS, worker.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        assert os.getsid(worker.pid) != os.getsid(0)  # a session of its own: group signals do not reach it
        worker.send_signal(signal.SIGTERM)
        mirror.checkpoint(_step(ckpt, 2, mb=2.0))
        assert mirror.drain(60)
        assert mirror._uploader.proc is worker and worker.poll() is None  # the SIGTERM was ignored
        worker.kill()
        worker.wait()
        mirror.checkpoint(_step(ckpt, 3, mb=2.0))
        assert mirror.drain(120)
        assert mirror._uploader.proc is not worker  # started again
    finally:
        mirror.close()
    assert worker.poll() is not None and mirror._uploader.proc is None  # close ends the worker
    assert _remote_complete(store, tmp_path) == "step_0000003"
    for step in (1, 2, 3):
        name = f"step_{step:07d}"
        assert store.get_bytes(f"{name}/model.safetensors") == (ckpt / name / "model.safetensors").read_bytes()
    assert sum(x.startswith("WARNING") for x in lines) <= 1  # at most the one episode of the killed worker


def test_a_stopped_upload_worker_is_killed_after_its_deadline_and_the_upload_goes_on(s3env, tmp_path):
    """A worker that stops answering (SIGSTOP) is not waited on forever: past the store's timeouts plus the
    file at 1 MB/s it is killed, the episode is warned once, and the retry goes up through a new worker."""
    store = Store(RemoteURL.parse(s3env), connect_timeout_s=1.0, read_timeout_s=1.0, attempts=1)
    ckpt = tmp_path / "c"
    lines: list[str] = []
    mirror = Mirror(store, ckpt, keep_last=3, log=lines.append, sleep=lambda s: None, upload_process=True).start()
    try:  # 1.1 MB: just above the worker's threshold, so the deadline is the timeouts plus about a second
        mirror.checkpoint(_step(ckpt, 1, mb=1.1))
        assert mirror.drain(60)
        assert mirror._uploader is not None and mirror._uploader.proc is not None
        stopped = mirror._uploader.proc
        stopped.send_signal(signal.SIGSTOP)
        mirror.checkpoint(_step(ckpt, 2, mb=1.1))
        assert mirror.drain(120, failures=0)  # through the failure, to the retry's success
        assert stopped.poll() is not None and mirror._uploader.proc is not stopped
    finally:
        mirror.close()
    warnings = [x for x in lines if x.startswith("WARNING")]
    assert len(warnings) == 1 and "no answer within" in warnings[0], lines
    assert _remote_complete(store, tmp_path) == "step_0000002"


def test_a_newer_checkpoint_never_cancels_the_upload_in_progress(s3, s3env, tmp_path):
    """Step 1's upload hangs (the link stalls); steps 2 and 3 are written meanwhile: step 1 still completes,
    step 3 replaces the unstarted step 2, and the remote ends at step 3."""
    proxy = Proxy(s3.port)
    proxy.hold_on = b"step_0000001"
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # restored by s3env's monkeypatch
    store = Store(RemoteURL.parse(s3env))
    lines: list[str] = []
    mirror = Mirror(store, tmp_path / "c", keep_last=3, log=lines.append).start()
    try:
        mirror.checkpoint(_step(tmp_path / "c", 1, mb=0.1))
        assert wait_until(lambda: not proxy.flowing.is_set(), timeout=60)  # step 1 is on the wire, held
        mirror.checkpoint(_step(tmp_path / "c", 2, mb=0.1))
        mirror.checkpoint(_step(tmp_path / "c", 3, mb=0.1))
        assert mirror.pending() == ["step_0000001", "step_0000003"]
        proxy.resume()
        assert mirror.drain(60)
    finally:
        mirror.close()
        proxy.close()
    assert any("step_0000002 was not uploaded yet; step_0000003 replaces it" in x for x in lines)
    assert not [x for x in lines if x.startswith("WARNING")]
    os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
    check = Store(RemoteURL.parse(s3env))
    assert {k.split("/")[0] for k in check.list_objects("step_")} == {"step_0000001", "step_0000003"}
    assert _remote_complete(check, tmp_path) == "step_0000003"


def test_refused_credentials_mid_run_are_an_episode_not_a_dead_thread(s3env, tmp_path, monkeypatch):
    """A key revoked mid-run: boto3's upload raises its own S3UploadFailedError around the refusal; the
    mirror warns once, keeps its thread, and retries."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "revoked-secret-999")
    store = Store(RemoteURL.parse(s3env), attempts=1)
    lines: list[str] = []
    waits: list[float] = []
    mirror = Mirror(store, tmp_path / "c", keep_last=3, log=lines.append, sleep=waits.append).start()
    try:
        mirror.checkpoint(_step(tmp_path / "c", 1, mb=0.1))
        assert wait_until(lambda: len(waits) >= 2, timeout=60)
        assert mirror._thread is not None and mirror._thread.is_alive()
    finally:
        mirror.close()
    warnings = [x for x in lines if x.startswith("WARNING")]
    assert len(warnings) == 1 and ("SignatureDoesNotMatch" in warnings[0] or "auth" in warnings[0])
    assert "revoked-secret-999" not in "\n".join(lines)


def test_an_older_local_fallback_never_moves_the_remote_latest_back_nor_deletes_the_newer_step(s3env, tmp_path):
    """The same run on a machine whose disk holds an older checkpoint (step 2) than the remote's newest (step 4:
    the store was down at its launch, so nothing was pulled): its steps 2 and 3 are not uploaded, the remote
    latest stays at step 4 and step 4 stays whole, the ledger is not sent over the remote's; once the run has a
    newer checkpoint (5) it goes up, latest moves forward, and the prune removes only this run's old steps. A
    PIN added locally after a step went up holds remotely too."""
    from x1_pretrain.budget.ledger import LEDGER_FILE

    store = Store(RemoteURL.parse(s3env))
    old = tmp_path / "old-machine"
    mirror = Mirror(store, old, keep_last=5, log=print).start()
    for step in (1, 2, 4):
        mirror.checkpoint(_step(old, step, mb=0.05))
        assert mirror.drain(60)
    mirror.close()
    store.put_bytes(b'{"memory": {"spent_usd": 9.0}}', LEDGER_FILE)
    before = {k: store.get_bytes(k) for k in store.list_objects("step_0000004/")}
    new = tmp_path / "new-machine"
    run_owner.keep_local(new, run_owner.local_id(old))  # the same run (its checkpoint dir came along)
    lines: list[str] = []
    mirror = Mirror(store, new, keep_last=2, log=lines.append).start()
    for step in (2, 3):
        mirror.checkpoint(_step(new, step, mb=0.05))  # written here, so it is this disk's latest
        assert mirror.drain(60)
    (new / LEDGER_FILE).write_text('{"memory": {"spent_usd": 1.0}}')
    mirror.file(LEDGER_FILE)
    assert mirror.drain(60)
    assert store.get_bytes(ck.LATEST) == b"step_0000004\n"
    assert {k: store.get_bytes(k) for k in store.list_objects("step_0000004/")} == before
    assert b"9.0" in store.get_bytes(LEDGER_FILE)
    assert store.list_objects("step_0000003/") == {}
    said = [x for x in lines if x.startswith("WARNING")]
    assert any("step_0000002 is older than the remote's step_0000004" in x for x in said), lines
    assert any("not uploaded over it" in x for x in said), lines
    (new / "step_0000001").mkdir()
    (new / "step_0000001" / ck.PIN_FILE).write_text("keep\n")
    mirror.checkpoint(_step(new, 5, mb=0.05))
    assert mirror.drain(60)
    mirror.close()
    dirs = {k.split("/")[0] for k in store.list_objects("step_")}
    assert dirs == {"step_0000001", "step_0000004", "step_0000005"}
    assert "step_0000001/PIN" in store.list_objects("step_0000001/")
    assert _remote_complete(store, tmp_path) == "step_0000005"


def test_a_stop_whose_upload_cannot_finish_says_so_within_the_grace(s3, s3env, tmp_path):
    """After a SIGTERM the stop checkpoint goes up within what is left of --stop-grace-s; a link that hangs
    mid-upload ends the wait inside the grace, with a warning that names what did not go up and where a resume
    will start, and the remote's latest stays the last complete one."""
    from types import SimpleNamespace

    from x1_pretrain.launch.session import _end_mirror
    from x1_pretrain.supervise.signals import StopDeadline
    from x1_pretrain.trainer.loop import StopFlag

    proxy = Proxy(s3.port)
    os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint  # restored by s3env's monkeypatch
    ckpt = tmp_path / "c"
    lines: list[str] = []
    mirror = Mirror(Store(RemoteURL.parse(s3env)), ckpt, keep_last=3, log=lines.append, upload_process=True).start()
    try:
        mirror.checkpoint(_step(ckpt, 1, mb=2.0))
        assert mirror.drain(60)
        proxy.hold_on = b"step_0000002/model.safetensors"  # the worker's upload of the weights, not the DONE delete
        stop = StopFlag()
        mirror.checkpoint(_step(ckpt, 2, mb=2.0))  # the stop checkpoint
        assert wait_until(lambda: not proxy.flowing.is_set(), timeout=60)  # on the wire, and the link hangs
        stop.requested, stop.requested_at = "SIGTERM", time.monotonic()
        ctx = SimpleNamespace(
            mirror=mirror,
            ckpt_dir=ckpt,
            mlflow_store=None,
            log=lines.append,
            deadline=StopDeadline(stop, 4.0, lambda: None),
        )
        _end_mirror(ctx, 75)
        left = ctx.deadline.remaining()
    finally:
        mirror.close()
        proxy.close()
    assert left is not None and left > 0, f"the stop went {-left:.1f} s past its 4 s grace"
    said = [x for x in lines if "could not upload" in x]
    assert len(said) == 1 and "step_0000002" in said[0], lines
    assert "the remote's latest is step_0000001, the local one step_0000002" in said[0]
    os.environ["AWS_ENDPOINT_URL"] = s3.endpoint
    assert Store(RemoteURL.parse(s3env)).get_bytes(ck.LATEST) == b"step_0000001\n"


def test_a_prefix_another_run_owns_gets_nothing_and_loses_nothing(s3env, tmp_path):
    """A mirror whose launch could not reach the store (so nothing was checked then) finds the prefix owned by
    another run when the store answers: it uploads nothing and deletes nothing there, warns once and alerts."""
    store = Store(RemoteURL.parse(s3env))
    theirs = tmp_path / "theirs"
    mirror = Mirror(store, theirs, keep_last=1, log=print).start()
    mirror.checkpoint(_step(theirs, 1, mb=0.05))
    assert mirror.drain(60)
    mirror.close()
    before = {k: store.get_bytes(k) for k in store.list_objects()}
    mine = tmp_path / "mine"
    run_owner.keep_local(mine, "another-run")
    lines: list[str] = []
    alerts: list[str] = []
    mirror = Mirror(store, mine, keep_last=1, log=lines.append, alert=lambda s, b: alerts.append(s)).start()
    for step in (2, 3):
        mirror.checkpoint(_step(mine, step, mb=0.05))
        assert mirror.drain(60)
    mirror.file(ck.LATEST)
    assert mirror.drain(60)
    mirror.close()
    assert {k: store.get_bytes(k) for k in store.list_objects()} == before
    said = [x for x in lines if x.startswith("WARNING")]
    assert len(said) == 1 and f"belongs to run {run_owner.local_id(theirs)}" in said[0], lines
    assert alerts == [f"x1 checkpoint mirror refused ({store.url})"]


def test_abandoned_multipart_uploads_of_the_prefix_are_aborted_at_start_and_no_others(s3, s3env, tmp_path):
    """A killed process leaves a multipart upload (parts billed until aborted): the next mirror aborts those under
    its own prefix before its first upload, and leaves another prefix's alone, and the uploads other tools may
    have under way under its prefix (the cloud script's background push of the tokens)."""
    url = RemoteURL.parse(s3env)
    client = s3.client()
    cut = client.create_multipart_upload(Bucket=url.bucket, Key=url.key("step_0000009/model.safetensors"))
    client.upload_part(
        Bucket=url.bucket,
        Key=url.key("step_0000009/model.safetensors"),
        UploadId=cut["UploadId"],
        PartNumber=1,
        Body=b"x" * 1024,
    )
    other_key = f"{url.prefix}-other/step_0000001/model.safetensors"  # a sibling prefix that starts the same
    other = client.create_multipart_upload(Bucket=url.bucket, Key=other_key)
    tokens = client.create_multipart_upload(Bucket=url.bucket, Key=url.key("data/tokenized/train.bin"))  # remote push
    lines: list[str] = []
    mirror = Mirror(Store(url), tmp_path / "c", keep_last=2, log=lines.append).start()
    mirror.checkpoint(_step(tmp_path / "c", 1, mb=0.05))
    assert mirror.drain(60)
    mirror.close()
    left = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=url.bucket).get("Uploads", [])}
    assert cut["UploadId"] not in left and other["UploadId"] in left and tokens["UploadId"] in left
    assert any("aborted an unfinished multipart upload of step_0000009/model.safetensors" in x for x in lines)
    client.abort_multipart_upload(Bucket=url.bucket, Key=other_key, UploadId=other["UploadId"])
    client.abort_multipart_upload(
        Bucket=url.bucket, Key=url.key("data/tokenized/train.bin"), UploadId=tokens["UploadId"]
    )
