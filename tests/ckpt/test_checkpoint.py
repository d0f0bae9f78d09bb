from __future__ import annotations

import json
import random
import shutil
import signal

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import safetensors_io
from x1_pretrain.core.config import ModelConfig
from x1_pretrain.core.errors import X1Error
from x1_pretrain.model.transformer import Transformer, state_dict_for_saving

from ..procs import losses, progress_step, run_info, start, train_cmd, train_here, wait_for

SMALL = ModelConfig(n_layer=1, d_model=32, n_head=2, n_kv_head=1, d_ff=64, seq_len=16, vocab_size=300)


def snapshot(step: int, model: torch.nn.Module) -> ck.StepSnapshot:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)).backward()
    opt.step()
    return ck.StepSnapshot(step, state_dict_for_saving(model), opt.state_dict(), {"step": step, "rng": ck.rng_state()})


def test_write_verify_and_skip_damaged(tmp_path):
    model = Transformer(SMALL)
    for step in (10, 20, 30):
        path, size = ck.write_step_dir(tmp_path, snapshot(step, model))
        assert size > 0 and (path / "DONE").is_file()
    assert ck.read_latest(tmp_path) == "step_0000030"
    (tmp_path / "step_0000030" / "DONE").unlink()  # interrupted write
    raw = bytearray((tmp_path / "step_0000020" / "model.safetensors").read_bytes())
    raw[-1] ^= 0xFF  # bit rot
    (tmp_path / "step_0000020" / "model.safetensors").write_bytes(bytes(raw))
    warnings: list[str] = []
    found = ck.find_latest_complete(tmp_path, warnings.append)
    assert found is not None and found.step == 10
    assert "step_0000030: no DONE marker" in warnings[0]
    assert "step_0000020: model.safetensors fails its recorded sha256" in warnings[1]
    assert ck.find_latest_complete(tmp_path / "none", warnings.append) is None


def test_keep_last_k_plus_pinned(tmp_path):
    model = Transformer(SMALL)
    for step in range(1, 7):
        ck.write_step_dir(tmp_path, snapshot(step, model))
        if step == 2:
            (tmp_path / "step_0000002" / "PIN").touch()
    ck.prune(tmp_path, keep_last=3)
    assert [p.name for _, p in ck.list_step_dirs(tmp_path)] == [
        "step_0000002",
        "step_0000004",
        "step_0000005",
        "step_0000006",
    ]


def test_round_trip_is_byte_identical_and_loads_in_safetensors(tmp_path):
    torch.manual_seed(0)
    model = Transformer(SMALL)
    path, _ = ck.write_step_dir(tmp_path, snapshot(5, model))
    ck.write_final_files(tmp_path, path)
    final = tmp_path / "final.safetensors"
    again = Transformer(SMALL)
    ck.load_model_state(again, safetensors_io.load(final), final)
    safetensors_io.save(state_dict_for_saving(again), tmp_path / "resaved.safetensors", {"format": "pt"})
    assert (tmp_path / "resaved.safetensors").read_bytes() == final.read_bytes()
    from safetensors.torch import load_file

    loaded = load_file(str(final))
    assert "lm_head.weight" not in loaded and loaded["model.embed_tokens.weight"].dtype == torch.float32


def test_optimizer_state_is_never_unpickled_beyond_weights(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    torch.save({"state": Evil()}, tmp_path / "optimizer.pt")
    with pytest.raises(X1Error, match="cannot be loaded safely"):
        ck.load_optimizer(tmp_path / "optimizer.pt")


def test_optimizer_state_is_safetensors_plus_json_and_comes_back_bit_for_bit(tmp_path):
    """No pickle in a new checkpoint: every tensor of AdamW's state in optimizer.safetensors, the param groups
    (tuples, None, bools) and the parameter ids in optimizer.json, both hash-checked; the loaded state continues
    the optimizer bit for bit. The final files carry the pair and the lab's final-optimizer.pt."""
    torch.manual_seed(0)
    model = Transformer(SMALL)
    snap = snapshot(5, model)
    path, _ = ck.write_step_dir(tmp_path, snap)
    assert sorted(p.name for p in path.iterdir()) == [
        "DONE",
        "model.safetensors",
        "optimizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ]
    assert b"\x80\x02" not in (path / ck.OPTIM_FILE).read_bytes()[:16]  # not a pickle
    state, problem = ck.verify(path)
    assert problem is None and set(state["files"]) == {ck.MODEL_FILE, ck.OPTIM_FILE, ck.OPTIM_META}
    back = ck.load_optimizer(path)
    assert back["param_groups"] == snap.optimizer["param_groups"]
    assert isinstance(back["param_groups"][0]["betas"], tuple) and list(back["state"]) == list(snap.optimizer["state"])
    for pid, entry in snap.optimizer["state"].items():
        for name, t in entry.items():
            got = back["state"][pid][name]
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), (pid, name)
    twins = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, Transformer(SMALL))]
    twins[1].load_state_dict(back)
    twins[0].load_state_dict(snap.optimizer)
    assert ck.flatten_optimizer(twins[0].state_dict())[1] == ck.flatten_optimizer(twins[1].state_dict())[1]
    (path / ck.OPTIM_META).write_text(
        json.dumps({"format": "x1-optimizer/1", "state_dict": {"state": {"__tensor__": "o/not-there"}}})
    )
    with pytest.raises(X1Error, match="names a tensor 'o/not-there' its safetensors file lacks"):
        ck.load_optimizer(path)
    ck.write_step_dir(tmp_path, snapshot(6, model))
    hashes = ck.write_final_files(tmp_path, tmp_path / "step_0000006")
    assert set(hashes) == {ck.FINAL_MODEL, ck.FINAL_OPTIM, ck.FINAL_OPTIM_META, ck.FINAL_OPTIM_PT}
    final = ck.load_optimizer(tmp_path / ck.FINAL_OPTIM)
    lab = torch.load(tmp_path / ck.FINAL_OPTIM_PT, weights_only=True)
    assert final["param_groups"] == lab["param_groups"] and all(
        torch.equal(final["state"][k][n], lab["state"][k][n]) for k in final["state"] for n in final["state"][k]
    )


def test_an_old_optimizer_pt_is_refused_on_torch_before_2_6_with_the_reason_and_the_fix(tmp_path, monkeypatch):
    model = Transformer(SMALL)
    path, _ = ck.write_step_dir(tmp_path, snapshot(3, model))
    legacy = ck.load_optimizer(path)
    for name in (ck.OPTIM_FILE, ck.OPTIM_META):
        (path / name).unlink()
    torch.save(legacy, path / ck.LEGACY_OPTIM)  # a checkpoint of an x1 before the safetensors state
    if ck._torch_version() >= ck.SAFE_TORCH_LOAD:
        assert ck.load_optimizer(path)["param_groups"] == legacy["param_groups"]  # torch >= 2.6: read
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    with pytest.raises(
        X1Error,
        match=r"optimizer\.pt.*cannot be loaded safely with torch 2\.5\.1\+cu124.*"
        r"CVE-2025-32434.*Fix: resume this checkpoint once with torch >= 2\.6",
    ):
        ck.load_optimizer(path)


def test_weights_that_do_not_fit_are_named(tmp_path):
    with pytest.raises(X1Error, match="do not fit this model"):
        ck.load_model_state(Transformer(SMALL), {"bogus": torch.zeros(1)}, tmp_path)


def test_rng_round_trip():
    import numpy as np

    st = ck.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    ck.restore_rng(json.loads(json.dumps(st)))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


# --- real processes where the behaviour is the process's end (a kill, a signal); its resume in this one -------
# half the FAST batch (grad accumulation still 2): the properties below do not depend on the batch's size
HALF = ["--set", "train.batch_size=8", "--set", "train.micro_batch_size=4", "--set", "train.grad_accum_steps=2"]


def test_resume_after_sigkill_is_bitwise_identical(demo_data, tmp_path, capsys):
    """Run A: 2N steps straight (in this process). Run B: a real process SIGKILLed at a random moment after its
    step-N checkpoint, then resumed (in this process). Grad accumulation is 2 and an eval falls between. Every
    tensor and every overlapping logged loss must be bitwise identical."""
    n = 6
    extra = ["--set", "checkpoint.async_save=false", *HALF]
    a = tmp_path / "a"
    assert train_here(train_cmd(demo_data, a, 2 * n, *extra, ckpt_every=n, eval_every=4)) == 0
    b = tmp_path / "b"
    proc = start(train_cmd(demo_data, b, 2 * n, *extra, ckpt_every=n, eval_every=4), tmp_path / "b1.log")
    wait_for(lambda: (b / "step_0000006" / "DONE").exists(), proc=proc)
    kill_after = random.randint(0, 2)  # steps past the checkpoint; 4 more to go, so the kill lands before the end
    wait_for(lambda: progress_step(b) >= n + kill_after or proc.poll() is not None, proc=None)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (b / "final.safetensors").exists()
    capsys.readouterr()
    assert train_here(train_cmd(demo_data, b, 2 * n, *extra, "--resume-from-latest", ckpt_every=n, eval_every=4)) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "step_0000006" in out
    fa, fb = safetensors_io.load(a / "final.safetensors"), safetensors_io.load(b / "final.safetensors")
    assert fa.keys() == fb.keys()
    for k in fa:
        assert torch.equal(fa[k], fb[k]), k
    assert (a / "final.safetensors").read_bytes() == (b / "final.safetensors").read_bytes()
    la, lb = losses(a), losses(b)
    assert set(la) == set(lb) == set(range(1, 2 * n + 1))
    assert all(la[s] == lb[s] for s in la)
    _, runs = run_info(b)
    assert len(runs) == 1  # the resumed process continued the same MLflow run


def test_sigkill_during_checkpoint_write_is_survived(demo_data, tmp_path):
    ckpt = tmp_path / "c"
    proc = start(
        train_cmd(demo_data, ckpt, 200, "--set", "checkpoint.async_save=false", *HALF, ckpt_every=1), tmp_path / "log"
    )
    wait_for(lambda: (ckpt / "step_0000002").exists(), proc=proc)
    wait_for(lambda: any(ckpt.glob(".step_*.tmp-*")), proc=proc, every=0.0005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    latest = ck.read_latest(ckpt)
    state, problem = ck.verify(ckpt / latest)
    assert problem is None and state is not None
    complete = [p for _, p in ck.list_step_dirs(ckpt)]
    assert all(ck.verify(p)[1] is None for p in complete)
    assert (
        train_here(
            train_cmd(
                demo_data, ckpt, state["step"] + 2, *HALF, "--resume-from-latest", "--allow-config-change", ckpt_every=1
            )
        )
        == 0
    )
    assert not any(ckpt.glob(".step_*.tmp-*")), "stale temporary dirs are cleaned up"


def test_sigusr1_checkpoints_and_trains_on_then_sigterm_checkpoints_and_exits_75(demo_data, tmp_path):
    """One trainer, two signals: SIGUSR1 writes a checkpoint and training goes on past it; a later SIGTERM
    finishes the step, checkpoints, exits 75 and leaves the MLflow run KILLED."""
    ckpt, log = tmp_path / "c", tmp_path / "log"
    proc = start(train_cmd(demo_data, ckpt, 500, *HALF), log)
    try:
        wait_for(lambda: progress_step(ckpt) >= 2, proc=proc)
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: "(requested (SIGUSR1))" in log.read_text(), proc=proc)
        (requested,) = [p for _, p in ck.list_step_dirs(ckpt)]
        assert ck.verify(requested)[1] is None
        at = int(requested.name.split("_")[1])
        wait_for(lambda: progress_step(ckpt) >= at + 2, proc=proc)  # training went on after it
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert "SIGTERM received: stopping after step" in out and "clean stop" in out
    latest = ck.read_latest(ckpt)
    state, problem = ck.verify(ckpt / latest)
    assert problem is None and state["step"] >= at + 2
    _, runs = run_info(ckpt)
    assert runs[0].info.status == "KILLED"


def test_second_sigint_aborts_at_once(demo_data, tmp_path):
    ckpt = tmp_path / "c"
    slow = [
        "--set",
        "train.batch_size=512",
        "--set",
        "train.micro_batch_size=64",
        "--set",
        "train.grad_accum_steps=8",
    ]  # steps of ~4 s, so both signals land inside one
    log = tmp_path / "log"
    proc = start(train_cmd(demo_data, ckpt, 50, *slow), log)
    # The val loss of step 0 is the last thing before the first step: a signal after it lands inside step 1
    # (or in the agreement just before it, which stops after step 1 too), ~4 s before any stop could be taken.
    wait_for(lambda: f"step {0:>7} | val loss" in log.read_text(), proc=proc)
    proc.send_signal(signal.SIGINT)
    # Two SIGINTs that arrive before Python runs the handler merge into one call (a long torch op on a loaded
    # machine holds the main thread): send the second only once the first has been heard, which the trainer says.
    wait_for(lambda: "SIGINT heard: finishing the current step" in log.read_text(), timeout=60, proc=proc)
    assert "a second Ctrl-C aborts without a checkpoint" in log.read_text()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, (tmp_path / "log").read_text()[-3000:]
    assert "aborted by a second SIGINT" in (tmp_path / "log").read_text()
    assert not ck.list_step_dirs(ckpt)


def test_a_resume_with_nothing_starts_fresh_and_refuses_to_mix_runs_and_config_changes(demo_data, tmp_path, capsys):
    """--resume-from-latest on an empty dir starts fresh; then a fresh start over its checkpoints, a changed
    config and other data are refused (exit 2, naming the fix); --allow-config-change resumes and tags the run.
    (In this process: none of it depends on a process of its own.)"""
    ckpt = tmp_path / "c"
    assert train_here(train_cmd(demo_data, ckpt, 2, "--resume-from-latest")) == 0
    out = capsys.readouterr().out
    assert "no complete checkpoint" in out and "starting fresh" in out
    assert train_here(train_cmd(demo_data, ckpt, 2)) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert train_here(train_cmd(demo_data, ckpt, 2, "--resume-from-latest", "--set", "optim.lr=0.01")) == 2
    err = capsys.readouterr().err
    assert "optim.lr: 0.003 -> 0.01" in err and "--allow-config-change" in err
    other = tmp_path / "other-data"
    shutil.copytree(demo_data, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["sources"][0]["bytes"] += 1
    (other / "meta.json").write_text(json.dumps(meta))
    assert train_here(train_cmd(other, ckpt, 2, "--resume-from-latest")) == 2
    assert "describes other tokens" in capsys.readouterr().err
    assert train_here(train_cmd(demo_data, ckpt, 3, "--resume-from-latest", "--allow-config-change")) == 0
    _client, runs = run_info(ckpt)
    assert "train.total_steps: 2 -> 3" in runs[0].data.tags["config_changed_on_resume"]
