"""Two CPU processes under torchrun (gloo) against one process with the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import names as N
from x1_pretrain.core import safetensors_io
from x1_pretrain.trainer.device import effective_compile_scope
from x1_pretrain.trainer.distributed import World

from ..conftest import REPO, seed_store, shared_build
from ..procs import children, listening, losses, progress_step, run_info, start, train_cmd, train_here, wait_for

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def ddp_cmd(data: Path, ckpt: Path, steps: int, *extra: str, **kw) -> list[str]:
    single = train_cmd(data, ckpt, steps, *extra, **kw)
    return [*TORCHRUN, *single[1:]]  # "-m x1_pretrain.train ..." after torchrun's own flags


def four_cmd(data: Path, ckpt: Path, steps: int, *extra: str, **kw) -> list[str]:
    return [*TORCHRUN[:-1], "--nproc_per_node=4", *train_cmd(data, ckpt, steps, *extra, **kw)[1:]]


def assert_same_run(one: Path, two: Path, steps: int) -> dict[str, torch.Tensor]:
    """The two runs logged the same losses at every step and ended with the same weights (returns ``two``'s)."""
    l1, l2 = losses(one), losses(two)
    assert set(l1) == set(l2) == set(range(1, steps + 1))
    for s in l1:
        assert abs(l1[s] - l2[s]) <= 1e-5 * abs(l1[s]), s
    w1, w2 = safetensors_io.load(one / "final.safetensors"), safetensors_io.load(two / "final.safetensors")
    # Gradients agree to float rounding (all-reduce vs accumulation order); AdamW's lr * m / sqrt(v) can turn that
    # into ~1e-5 on a weight whose gradient is near zero (seen: 1.16e-5 on one of 11,264, torch 2.5), so 5e-5.
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=5e-5, rtol=1e-4)
    return w2


def test_chunks_are_shared_out_over_ranks():
    assert World(0, 0, 2).chunks(6) == [0, 2, 4] and World(1, 1, 2).chunks(6) == [1, 3, 5]
    assert World().chunks(4) == [0, 1, 2, 3]
    assert sorted(c for r in range(4) for c in World(r, r, 4).chunks(8)) == list(range(8))  # any rank count


STEPS, MICRO = 8, ("--set", "train.micro_batch_size=4")


@pytest.fixture(scope="module")
def single_run(demo_data, tmp_path_factory) -> Path:
    """The reference: one process, 8 steps of the tiny config, a checkpoint every 4; made once a session, read,
    never changed. It runs in the test process: what it stands for is one process against several ranks, not a
    fresh interpreter."""
    from x1_pretrain import train

    def build(d: Path) -> None:
        assert train.main(train_cmd(demo_data, d / "one", STEPS, ckpt_every=4)[3:]) == 0

    return shared_build(tmp_path_factory, "distributed-single", build) / "one"


@pytest.fixture(scope="module")
def two_ranks(demo_data, tmp_path_factory) -> tuple[Path, str]:
    """The same job on 2 ranks with micro-batch 4, uninterrupted: (its checkpoint dir, its stdout); made once a
    session, read, never changed. Each rank accumulates 2 micro-steps, the first inside DDP's no_sync (no
    all-reduce until the last)."""

    def build(d: Path) -> None:
        r = subprocess.run(
            ddp_cmd(demo_data, d / "two", STEPS, *MICRO, ckpt_every=4), capture_output=True, text=True, cwd=REPO
        )
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        (d / "stdout.log").write_text(r.stdout)

    d = shared_build(tmp_path_factory, "distributed-two-ranks", build)
    return d / "two", (d / "stdout.log").read_text()


def test_two_ranks_match_one_process(single_run, two_ranks):
    """One process (micro-batch 8, 2 micro-steps) against 2 ranks with micro-batch 4 each accumulating 2: same
    global batch, same sequences, so the same losses and weights to float rounding; rank 0 alone wrote."""
    two, out = two_ranks
    assert "global batch 16 = micro-batch 4 x grad accumulation 2 x 2 ranks" in out
    assert_same_run(single_run, two, STEPS)
    assert [p.name for _, p in ck.list_step_dirs(two)] == ["step_0000004", "step_0000008"]


@pytest.fixture(scope="module")
def stopped_two_ranks(demo_data, tmp_path_factory) -> Path:
    """The same job on 2 ranks, SIGTERM to torchrun after its step-4 checkpoint (forwarded to both ranks): the
    checkpoint dir it leaves; made once a session, read, never changed (a test that resumes copies it)."""

    def build(d: Path) -> None:
        three = d / "three"
        proc = start(
            ddp_cmd(demo_data, three, STEPS, *MICRO, "--set", "checkpoint.async_save=false", ckpt_every=4),
            d / "three.log",
        )
        wait_for(lambda: progress_step(three) >= 5, proc=proc, timeout=180)
        proc.send_signal(signal.SIGTERM)  # to torchrun, which forwards it to both ranks
        proc.wait(timeout=120)

    return shared_build(tmp_path_factory, "distributed-stopped", build) / "three"


def test_a_sigterm_to_torchrun_stops_both_ranks_with_exit_75_and_a_stop_checkpoint(stopped_two_ranks):
    """torchrun forwards the SIGTERM; both ranks stop at a step boundary, rank 0 writes the stop checkpoint past
    the periodic one and reports exit 75 (preempted: relaunch with --resume-from-latest)."""
    status = json.loads((stopped_two_ranks / "exit_status.json").read_text())
    assert status["exit_code"] == 75
    stopped = ck.read_latest(stopped_two_ranks)
    assert stopped is not None and int(stopped.split("_")[1]) >= 5
    assert "step_0000004" in [p.name for _, p in ck.list_step_dirs(stopped_two_ranks)]
    assert not (stopped_two_ranks / "final.safetensors").exists()


def test_a_stop_on_two_ranks_resumes_bit_for_bit(demo_data, two_ranks, stopped_two_ranks, tmp_path):
    """The stopped job resumed with the same world size: the final weights equal the uninterrupted run's bit for
    bit."""
    three = tmp_path / "three"
    shutil.copytree(stopped_two_ranks, three, ignore=shutil.ignore_patterns("*.lock"))
    r = subprocess.run(
        ddp_cmd(demo_data, three, STEPS, *MICRO, "--resume-from-latest", ckpt_every=4),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"resuming from {three / ck.read_latest(stopped_two_ranks)}" in r.stdout
    w2 = safetensors_io.load(two_ranks[0] / "final.safetensors")
    w3 = safetensors_io.load(three / "final.safetensors")
    assert all(torch.equal(w2[k], w3[k]) for k in w2)


def _lost_after(src: Path, dest: Path, step: int) -> Path:
    """``src``'s checkpoint dir as a machine lost right after its step-``step`` checkpoint would have left it
    (its later steps, final weights, exit status and MLflow store gone: a fresh store takes the new machine's)."""
    shutil.copytree(
        src,
        dest,
        ignore=shutil.ignore_patterns("mlflow.db*", "final.safetensors", "exit_status.json", "progress.json", "*.lock"),
    )
    for n, path in ck.list_step_dirs(dest):
        if n > step:
            shutil.rmtree(path)
    (dest / "latest").write_text(f"step_{step:07d}\n")
    return seed_store(dest)


def test_a_checkpoint_resumes_on_another_rank_count_with_the_same_batches(
    demo_data, single_run, two_ranks, tmp_path, capsys
):
    """Written by 2 ranks, resumed by 1 process; written by 1 process (micro-batch 8), resumed by 4 ranks
    (micro-batch 4): the same sequences at every step, so the losses and the final weights equal those of an
    uninterrupted single process to float rounding (the issue's bound: 1e-4 on a weight). The one process runs
    here (its rank count is the behaviour, not its interpreter); the 4 ranks under torchrun."""
    from x1_pretrain import train

    ref_loss, ref_w = losses(single_run), safetensors_io.load(single_run / "final.safetensors")
    two_to_one, one_to_four = (
        _lost_after(two_ranks[0], tmp_path / "two-to-one", 4),
        _lost_after(single_run, tmp_path / "one-to-four", 4),
    )
    capsys.readouterr()
    assert (
        train.main(train_cmd(demo_data, two_to_one, STEPS, "--resume-from-latest", ckpt_every=4, seed=False)[3:]) == 0
    )
    in_process = capsys.readouterr().out
    r = subprocess.run(
        four_cmd(demo_data, one_to_four, STEPS, *MICRO, "--resume-from-latest", ckpt_every=4, seed=False),
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for dest, out in ((two_to_one, in_process), (one_to_four, r.stdout)):
        assert "written by" in out and "the same global batch (16 sequences" in out, out[-3000:]
        got = losses(dest)
        assert set(got) == {5, 6, 7, 8}
        for s in got:
            assert abs(got[s] - ref_loss[s]) <= 1e-5 * abs(ref_loss[s]), (dest.name, s, got[s], ref_loss[s])
        w = safetensors_io.load(dest / "final.safetensors")
        worst = max(float((w[k] - ref_w[k]).abs().max()) for k in ref_w)
        print(f"{dest.name}: max |weight difference| against one process: {worst:.2e}")
        assert worst <= 1e-4, (dest.name, worst)


def test_the_watchdog_sees_the_trainers_code_through_torchrun(demo_data, tmp_path):
    """torchrun exits 1 for any failing worker; rank 0's recorded code (here a usage error, 2) must stop
    the watchdog instead of being relaunched."""
    ckpt = tmp_path / "c"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--max-restarts",
        "3",
        "--",
        *ddp_cmd(demo_data, ckpt, 4, "--set", "optim.lr=1e30", "--set", "optim.min_lr=0"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 5, (r.stdout + r.stderr)[-3000:]
    assert "the trainer (rank 0) recorded exit 5 (diverged)" in r.stderr
    assert "relaunching with --resume-from-latest" not in r.stderr


def test_a_budget_stop_at_start_ends_every_rank(demo_data, tmp_path):
    """Rank 0 alone reads the budget; its verdict before the first step must reach rank 1 (no hang)."""
    from datetime import datetime, timezone

    budget = tmp_path / "budget.json"
    budget.write_text(
        json.dumps(
            {
                "spent_usd": 36.0,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 30,
                "projected_total_usd": 36.0,
                "last_update_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
    )
    ckpt = tmp_path / "c"
    r = subprocess.run(
        ddp_cmd(
            demo_data,
            ckpt,
            5,
            "--budget-cap-usd",
            "35",
            "--budget-curr-cost-uri",
            str(budget),
            "--budget-expected-step-s",
            "0.1",
            "--force-launch",
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert r.returncode != 0
    assert json.loads((ckpt / "exit_status.json").read_text())["exit_code"] == 4
    assert ck.list_step_dirs(ckpt) == []


def test_a_usage_error_under_torchrun_is_not_relaunched(demo_data, tmp_path):
    """A fresh run with a config mistake: no checkpoint dir exists, so rank 0 reports its exit 2 through the
    status file the watchdog owns ($X1_EXIT_STATUS)."""
    ckpt = tmp_path / "fresh"
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.watchdog",
        "--backoff-s",
        "0.1",
        "--max-restarts",
        "3",
        "--",
        *ddp_cmd(demo_data, ckpt, 4, "--set", "model.n_head=5", seed=False),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    assert "relaunching with --resume-from-latest" not in r.stderr
    assert not ckpt.exists()


def test_two_ranks_under_torch_compile_match_one_eager_process(demo_data, tmp_path):
    """DDP + torch.compile (mode default, gloo, a cold private Inductor cache): the same losses as one eager
    process with the same global batch, to 1e-4; no fallback to eager; each rank compiles with its share of the
    host's CPUs. On one layer (the smallest graph with every kind of kernel: embedding, block, head, loss); the
    eager process runs here (its numbers are the reference, not its interpreter)."""
    from x1_pretrain import train

    steps, micro, small = 3, MICRO, ("--set", "model.n_layer=1")
    one = tmp_path / "one"
    assert train.main(train_cmd(demo_data, one, steps, *small)[3:]) == 0
    two = tmp_path / "two"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
    r = subprocess.run(
        ddp_cmd(demo_data, two, steps, *micro, *small, "--compile", "--set", "train.compile_mode=default"),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "torch.compile failed" not in out
    scope = effective_compile_scope("model", 2, 2)[0]  # blocks on a torch whose DDP whole graph is wrong
    assert f"torch.compile mode=default, scope {scope}" in out
    (run,) = run_info(two)[1]
    assert run.data.tags[N.TAG_COMPILE_SCOPE_EFFECTIVE] == scope
    cpus = len(os.sched_getaffinity(0))
    assert f"{max(1, cpus // 2)} compile threads for each of the 2 ranks" in out
    l1, l2 = losses(one), losses(two)
    assert set(l1) == set(l2) == set(range(1, steps + 1))
    for s in l1:
        assert abs(l1[s] - l2[s]) <= 1e-4 * abs(l1[s]), (s, l1[s], l2[s])


def node_cmd(data: Path, ckpt: Path, steps: int, addr: str, port: int, *extra: str, **kw) -> list[str]:
    """One of two torchrun "nodes" on this machine: c10d rendezvous at 127.0.0.1:``port``; torchrun orders the
    nodes by address, so the one at 127.0.0.1 holds rank 0 and the one at 127.0.0.2 rank 1."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=x1-two-nodes",
        f"--local-addr={addr}",
        *train_cmd(data, ckpt, steps, *extra, **kw)[1:],
    ]


def test_two_nodes_a_lost_node_ends_the_other_at_once_naming_it(demo_data, tmp_path):
    """Two c10d nodes, each with a disk of its own. Node 1 is killed (SIGKILL to its torchrun and trainer) after
    the step-4 checkpoint: node 0 exits non-zero at once, not after a timeout, and its exit status says a rank
    was lost; rank 0 alone wrote checkpoints and MLflow. (The resume with a new node: the next test.)"""
    from ..s3server import free_port

    disk0, disk1 = tmp_path / "node0", tmp_path / "node1"
    port = free_port()
    sync = ("--set", "checkpoint.async_save=false")
    # node 0 first: its torchrun hosts the rendezvous store, as the head node of a cluster does
    node0 = start(node_cmd(demo_data, disk0, STEPS, "127.0.0.1", port, *sync, ckpt_every=4), tmp_path / "node0.log")
    wait_for(lambda: listening(port), proc=node0, timeout=120)
    with open(tmp_path / "node1.log", "w") as out:
        node1 = subprocess.Popen(
            node_cmd(demo_data, disk1, STEPS, "127.0.0.2", port, *sync, ckpt_every=4, seed=False),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: progress_step(disk0) >= 5, proc=node0, timeout=300)
        for pid in [node1.pid, *children(node1.pid)]:  # the machine is gone: torchrun and its trainer
            os.kill(pid, signal.SIGKILL)
        import time

        killed_at = time.monotonic()
        node0.wait(timeout=120)
        took = time.monotonic() - killed_at
    finally:
        for p in (node0, node1):
            if p.poll() is None:
                p.kill()
    log0 = (tmp_path / "node0.log").read_text()
    print(f"node 0 exited {node0.returncode} {took:.1f} s after node 1 was killed")
    assert node0.returncode != 0 and took < 60, log0[-3000:]
    status = json.loads((disk0 / "exit_status.json").read_text())
    assert status["exit_code"] == 1 and "another rank stopped answering" in status["reason"], status
    assert ck.read_latest(disk0) == "step_0000004" and ck.list_step_dirs(disk1) == []
    assert not (disk1 / "mlflow.db").exists()


def test_two_nodes_a_new_node_with_an_empty_disk_joins_the_resume(demo_data, single_run, two_ranks, tmp_path):
    """Node 0's disk as a run of 2 ranks left it when node 1 was lost after the step-4 checkpoint; a new node 1
    with an empty disk joins the resume (two c10d nodes): it receives step 4 from rank 0 (read, then deleted), and
    the run ends with the losses and weights of one uninterrupted process. Rank 0 alone wrote MLflow."""
    from ..s3server import free_port

    disk0, new_disk1 = _lost_after(two_ranks[0], tmp_path / "node0", 4), tmp_path / "node1-new"
    port = free_port()
    resume = ("--resume-from-latest", *MICRO)
    node0 = start(
        node_cmd(demo_data, disk0, STEPS, "127.0.0.1", port, *resume, ckpt_every=4, seed=False),
        tmp_path / "node0-again.log",
    )
    try:
        wait_for(lambda: listening(port), proc=node0, timeout=120)
        r = subprocess.run(
            node_cmd(demo_data, new_disk1, STEPS, "127.0.0.2", port, *resume, ckpt_every=4, seed=False),
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        out0 = (tmp_path / "node0-again.log").read_text()
        assert node0.wait(timeout=120) == 0, out0[-3000:]
    finally:
        if node0.poll() is None:
            node0.kill()
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "rank 0 sends step_0000004 to rank(s) 1" in out0, out0[-3000:]
    assert ck.list_step_dirs(new_disk1) == [] and not list(new_disk1.glob(".step_*"))  # received, read, deleted
    assert not (new_disk1 / "mlflow.db").exists()
    ref_loss, ref_w = losses(single_run), safetensors_io.load(single_run / "final.safetensors")
    got = losses(disk0)
    assert set(got) == set(range(5, STEPS + 1))
    for s in got:
        assert abs(got[s] - ref_loss[s]) <= 1e-5 * abs(ref_loss[s]), (s, got[s], ref_loss[s])
    w = safetensors_io.load(disk0 / "final.safetensors")
    worst = max(float((w[k] - ref_w[k]).abs().max()) for k in ref_w)
    print(f"two nodes, node 1 replaced after step 4: max |weight difference| against one process: {worst:.2e}")
    assert worst <= 1e-4


def test_a_rendezvous_that_cannot_form_is_a_clear_error_within_its_timeout(demo_data, tmp_path):
    """Node 0 of two, and the other never comes (a wrong endpoint or a closed port on its side): torchrun waits
    its join_timeout (2 s here, 600 s by default) and fails with a traceback; the watchdog says what happened,
    relaunches once, and ends on the second failure in a row (a crash loop) instead of waiting forever."""
    import time

    from ..s3server import free_port

    port = free_port()
    node = node_cmd(demo_data, tmp_path / "c", 4, "127.0.0.1", port, seed=False)
    at = node.index("--local-addr=127.0.0.1") + 1
    node[at:at] = ["--rdzv-conf=join_timeout=2"]
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "x1_pretrain.watchdog", "--backoff-s", "0.1", "--max-restarts", "5", "--", *node],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    took = time.monotonic() - t0
    print(f"the watchdog ended {took:.0f} s after the start (two waits of 2 s)")
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.count(f"torchrun's rendezvous of 2 nodes at 127.0.0.1:{port} did not form") == 2, r.stderr[-3000:]
    assert "a crash loop; not relaunching" in r.stderr
    assert took < 2 * (2 + 60)


_PEER = r"""
import os, sys
from pathlib import Path
import torch
from x1_pretrain.core.errors import X1Error
from x1_pretrain.trainer import distributed as D
rank = int(os.environ["RANK"])
torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
world = D.World(rank, rank, 2)
files, name = Path(sys.argv[1]), Path(sys.argv[2])
if rank == 0:   # a hostile peer: its listing names paths outside the receiver's folder, then its checkpoint's name
    D.from_rank([("../../escaped", 6), ("DONE", 3)], world, 0)
    D.gather_all((("../../escaped", "0" * 64), None, "fp"), world)
else:
    from x1_pretrain.launch.resume import RankStart, Resume, agree_on_checkpoint
    for mode, receive in (("files", lambda: D.send_files(None, files / ".step_0000004.pull-1", world, "cpu", 0)),
                          ("name", lambda: agree_on_checkpoint(RankStart(Resume(), None, "fp"), name, world, "cpu",
                                                               print))):
        try:
            receive()
            print(mode, "accepted", flush=True)
        except X1Error as e:
            print(mode, "refused:", e, flush=True)
torch.distributed.barrier()  # neither exits while the other still talks to it (gloo aborts a rank left alone)
torch.distributed.destroy_process_group()
"""


def test_a_peer_ranks_file_names_are_checked_before_anything_is_written(tmp_path):
    """The checkpoint transfer between ranks (gloo, two real processes): a listing from the sending rank that
    names ``../../escaped`` (a file), then a checkpoint of that name, are each refused on the receiving rank,
    naming it, and nothing is written outside."""
    from ..s3server import free_port

    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "PYTHONPATH": str(REPO / "src"),
    }
    files, name = tmp_path / "files" / "ckpt", tmp_path / "name" / "ckpt"
    files.mkdir(parents=True)
    name.mkdir(parents=True)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PEER, str(files), str(name)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "accepted" not in outs[1], outs
    for ckpt in (files, name):
        assert not (ckpt.parent / "escaped").exists() and not (ckpt / "escaped").exists()
        assert not (tmp_path / "escaped").exists()
    assert "files refused: rank 0 sent a file named '../../escaped' would be written outside its folder" in outs[1]
    assert [p.name for p in files.iterdir()] == [".step_0000004.pull-1"] and not any(files.rglob("*/*"))
    assert "name refused: rank 0 names its checkpoint '../../escaped', not a step_NNNNNNN dir" in outs[1]
    assert list(name.iterdir()) == []


def test_muon_on_two_ranks_matches_one_process_and_resumes_on_one(demo_data, tmp_path):
    """optim.name=muon with fused projections: 2 ranks (micro-batch 4, 2 micro-steps each) against one process
    (micro-batch 8): the same losses and weights to the AdamW bound. DDP all-reduces the gradients before the
    step, so every rank orthogonalises the same updates. x1's Muon (fp32 on a CPU): torch's rounds the update to
    bf16, which turns the all-reduce's float rounding into 1e-5 of a loss by step 4. Then the two ranks' step-2
    checkpoint resumed by one process (Muon's momentum buffers are whole on every rank, as AdamW's moments are):
    steps 3 and 4 and the final weights are the uninterrupted one process's again."""
    muon = ("--set", "optim.name=muon", "--set", "model.fused_projections=true", "--set", "optim.muon_impl=x1")
    one, two = tmp_path / "one", tmp_path / "two"
    assert train_here(train_cmd(demo_data, one, 4, *muon)) == 0
    r = subprocess.run(
        ddp_cmd(demo_data, two, 4, *MICRO, *muon, ckpt_every=2), capture_output=True, text=True, cwd=REPO
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "optimizer: Muon" in r.stdout and "Newton–Schulz:" in r.stdout
    assert_same_run(one, two, 4)
    two_to_one = _lost_after(two, tmp_path / "two-to-one", 2)
    assert train_here(train_cmd(demo_data, two_to_one, 4, *muon, "--resume-from-latest", seed=False)) == 0
    got, ref = losses(two_to_one), losses(one)
    assert set(got) == {3, 4} and all(abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]) for s in got), (got, ref)
    w, ref_w = safetensors_io.load(two_to_one / "final.safetensors"), safetensors_io.load(one / "final.safetensors")
    for k in ref_w:
        torch.testing.assert_close(w[k], ref_w[k], atol=5e-5, rtol=1e-4)
