"""Muon on the hidden matrices (optim.name: muon): the update against torch's, the split of fused weights, which
weights each optimizer takes, the schedule, the FLOPs, and a real run stopped by SIGTERM and resumed bit for
bit; the other optimizer refused at resume unless --reset-optimizer."""

from __future__ import annotations

import dataclasses
import shutil
import signal

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import config as C
from x1_pretrain.core import safetensors_io
from x1_pretrain.model.transformer import Transformer
from x1_pretrain.trainer.muon import Muon, adjusted_lr, newton_schulz_flops, orthogonalise, torch_muon
from x1_pretrain.trainer.optim import MuonAdamW, build_optimizer, newton_schulz_flops_per_step, set_lr

from ..conftest import TINY
from ..procs import progress_step, start, train_cmd, train_here, wait_for

CPU = torch.device("cpu")
SHAPES = [(48, 16), (16, 48), (32, 32), (8, 64)]  # tall, wide, square, very wide


def _grads(steps: int, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(steps)]


def _run(cls, grads, ns_dtype=None, **kw) -> list[torch.Tensor]:
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in SHAPES]
    opt = cls(params, lr=0.02, momentum=0.95, weight_decay=0.01, **kw)
    if ns_dtype is not None:
        opt.ns_dtype = ns_dtype
    for step in grads:
        for p, g in zip(params, step, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params]


@pytest.mark.skipif(torch_muon() is None, reason="this torch has no torch.optim.Muon (the compat lane's 2.5)")
@pytest.mark.parametrize("rule", [None, "match_rms_adamw"])
def test_x1_muon_equals_torch_muon_on_the_same_gradients(rule):
    """Five steps on four shapes. In bf16 (what both run on a GPU) ours is torch's to 1e-6 of a weight; ours in
    fp32 (its CPU default) differs from torch's bf16 only by bf16's rounding of the update (< 2e-3 of lr a step)."""
    grads = _grads(5)
    theirs = _run(torch_muon(), grads, adjust_lr_fn=rule)
    ours_bf16 = _run(Muon, grads, adjust_lr_fn=rule, ns_dtype=torch.bfloat16)
    ours_fp32 = _run(Muon, grads, adjust_lr_fn=rule)
    for t, b, f in zip(theirs, ours_bf16, ours_fp32, strict=True):
        torch.testing.assert_close(b, t, atol=1e-6, rtol=0)
        step = 0.02 * (0.2 * max(t.shape) ** 0.5 if rule else max(1.0, t.shape[0] / t.shape[1]) ** 0.5)
        assert (f - t).abs().max() < 5 * step * 2e-2, (f - t).abs().max()
        assert not torch.equal(f, t)  # the two precisions really differ: the bound above is what was tested


def test_newton_schulz_makes_every_singular_value_about_one():
    """Singular values spread over 2.5 decades come out in [0.6, 1.25] after the 5 rounds Muon runs."""
    torch.manual_seed(0)
    u, v = torch.linalg.qr(torch.randn(64, 24))[0], torch.linalg.qr(torch.randn(24, 24))[0]
    g = u @ torch.diag(torch.logspace(-1.5, 1, 24)) @ v
    s = torch.linalg.svdvals(orthogonalise(g, 5, dtype=torch.float32))
    assert s.min() > 0.6 and s.max() < 1.25, s
    assert orthogonalise(g, 5, dtype=torch.float32).shape == g.shape


def test_the_lr_rules_and_the_flop_count():
    assert adjusted_lr(0.02, None, (64, 16)) == pytest.approx(0.04)  # sqrt(64/16)
    assert adjusted_lr(0.02, "original", (16, 64)) == pytest.approx(0.02)
    assert adjusted_lr(3e-3, "match_rms_adamw", (16, 64)) == pytest.approx(3e-3 * 0.2 * 8)
    # per round: X X^T (m x n by n x m), A A (m^3), then (m x m) by (m x n); each multiply-add 2 FLOPs
    m, n = 16, 64
    assert newton_schulz_flops((n, m), 5) == 5 * (2 * m * n * m + 2 * m * m * m + 2 * m * m * n)


def _model(*sets: str, **model_sets):
    cfg = C.load(TINY, sets=["optim.name=muon", *sets, *[f"model.{k}={v}" for k, v in model_sets.items()]])
    torch.manual_seed(0)
    return Transformer(cfg.model), cfg


def test_muon_takes_each_hidden_matrix_and_adamw_the_rest():
    model, cfg = _model(tie_embeddings="false")
    opt = build_optimizer(model, cfg, CPU)
    assert isinstance(opt, MuonAdamW)
    muon = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    adam = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in muon} == {n for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2}
    assert {names[i] for i in adam} == {n for n, p in model.named_parameters() if id(p) not in muon}
    assert "lm_head.weight" in {names[i] for i in adam} and "model.embed_tokens.weight" in {names[i] for i in adam}
    assert all(".layers." not in names[i] or "norm" in names[i] for i in adam)


def test_a_fused_weight_is_orthogonalised_part_by_part():
    """The same weights and batch with q/k/v and gate/up fused or not: one Muon step leaves the same weights (to
    float rounding), so each logical matrix was orthogonalised on its own, not the fused block as one. (x1's
    Muon in fp32: torch's rounds the update to bf16, where the two layouts' float-rounding differences in the
    gradient show as 1e-4.)"""
    plain, cfg = _model("optim.muon_impl=x1", fused_projections="false")
    fused, cfg_f = _model("optim.muon_impl=x1", fused_projections="true")
    fused.load_state_dict(plain.state_dict())  # saved under Llama's names either way
    x = torch.randint(0, 50257, (2, 16))
    for m, c in ((plain, cfg), (fused, cfg_f)):
        opt = build_optimizer(m, c, CPU)
        m(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)  # the fused weights too, though neither optimizer holds them
        assert all(p.grad is None for p in m.parameters())
    a, b = plain.state_dict(), fused.state_dict()
    assert len(build_optimizer(fused, cfg_f, CPU).parts) == 2 * 5  # q, k, v, gate, up in each of 2 layers
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=2e-6, rtol=0)
    # whereas orthogonalising the fused q/k/v block as one matrix would have moved its rows differently
    w = fused.model.layers[0].self_attn.fused.weight
    g = torch.randn_like(w)
    whole = orthogonalise(g, 5, dtype=torch.float32)[: cfg.model.d_model]
    part = orthogonalise(g[: cfg.model.d_model], 5, dtype=torch.float32)
    assert (whole - part).abs().max() > 1e-2


def test_a_compiled_model_trains_with_muon_as_the_eager_one_does():
    """The optimizer stays outside the graph: Muon's in-place updates of the fused weights' part views reach the
    compiled model's parameters. AOTAutograd (the trainer's compile path without Inductor's C++ build, which
    costs 17 s cold here) against eager, 3 steps on the same batches, fused projections. x1's Muon (fp32 on a
    CPU): torch's rounds each update to bf16, which turns the graph's float rounding into 1e-3 of a weight."""
    runs = []
    for compiled in (False, True):
        model, cfg = _model("model.seq_len=16", "model.n_layer=1", "optim.muon_impl=x1", fused_projections="true")
        opt = build_optimizer(model, cfg, CPU)
        forward = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
        gen = torch.Generator().manual_seed(3)
        for _ in range(3):
            x = torch.randint(0, cfg.model.vocab_size, (2, 17), generator=gen)
            forward(x[:, :-1], x[:, 1:]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        runs.append({n: p.detach().clone() for n, p in model.named_parameters()})
    torch._dynamo.reset()
    start = _model("model.seq_len=16", "model.n_layer=1", fused_projections="true")[0]
    qkv = "model.layers.0.self_attn.fused.weight"
    assert not torch.equal(runs[1][qkv], dict(start.named_parameters())[qkv])  # the compiled run did train
    for n in runs[0]:
        torch.testing.assert_close(runs[1][n], runs[0][n], atol=1e-5, rtol=1e-4)  # seen: 2.4e-6, the embedding


def test_one_schedule_drives_both_groups():
    model, cfg = _model()
    opt = build_optimizer(model, cfg, CPU)
    set_lr(opt, cfg.optim.lr / 4, cfg.optim)  # a quarter of the peak (warm-up, decay or the budget fit's anneal)
    assert [g["lr"] for g in opt.muon.param_groups] == pytest.approx([cfg.optim.muon_lr / 4])
    assert [g["lr"] for g in opt.adamw.param_groups] == pytest.approx([cfg.optim.lr / 4] * 2)
    d = cfg.model.d_model
    per_block = 2 * newton_schulz_flops((d, d), 5) + 2 * newton_schulz_flops((d // 2, d), 5)  # q, o; k, v (GQA)
    per_block += 3 * newton_schulz_flops((cfg.model.d_ff, d), 5)
    assert newton_schulz_flops_per_step(opt) == cfg.model.n_layer * per_block
    adamw_cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, name="adamw"))
    assert newton_schulz_flops_per_step(build_optimizer(model, adamw_cfg, CPU)) == 0


def test_an_unknown_optimizer_is_a_config_error_naming_the_key_and_the_choices():
    with pytest.raises(C.ConfigError) as e:
        C.load(TINY, sets=["optim.name=lion"])
    assert "optim.name" in str(e.value) and "adamw" in str(e.value) and "muon" in str(e.value)


MUON = ("--set", "optim.name=muon", "--set", "model.fused_projections=true")
STEPS = 8


@pytest.fixture(scope="module")
def muon_run(demo_data, tmp_path_factory):
    """8 uninterrupted Muon steps in this process (checkpoints at 4 and 8): the reference."""
    d = tmp_path_factory.mktemp("muon") / "ref"
    assert train_here(train_cmd(demo_data, d, STEPS, *MUON, ckpt_every=4)) == 0
    return d


def test_a_muon_run_stopped_by_sigterm_resumes_bit_for_bit(demo_data, muon_run, tmp_path):
    """SIGTERM after the step-4 checkpoint: exit 75 and a stop checkpoint holding Muon's momentum buffers; the
    relaunch with --resume-from-latest ends with the uninterrupted run's weights, bit for bit."""
    ckpt = tmp_path / "stopped"
    cmd = train_cmd(demo_data, ckpt, STEPS, *MUON, "--set", "checkpoint.async_save=false", ckpt_every=4)
    proc = start(cmd, tmp_path / "first.log")
    wait_for(lambda: progress_step(ckpt) >= 5, proc=proc, timeout=120)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75, (tmp_path / "first.log").read_text()[-2000:]
    stopped = ck.find_latest_complete(ckpt, print)
    assert stopped is not None and stopped.step >= 5
    saved = ck.load_optimizer(stopped.path)
    assert saved["format"] == "x1-muon+adamw/1"
    assert {k for s in saved["muon"]["state"].values() for k in s} == {"momentum_buffer"}
    assert train_here([*cmd, "--resume-from-latest"]) == 0
    a, b = safetensors_io.load(muon_run / "final.safetensors"), safetensors_io.load(ckpt / "final.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _from_step_4(src, dest):
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("mlflow.db*", "final*", "exit_status.json", "*.lock"))
    shutil.rmtree(dest / "step_0000008")
    (dest / "latest").write_text("step_0000004\n")
    return dest


def test_resuming_with_the_other_optimizer_is_refused_unless_reset(demo_data, muon_run, tmp_path, capsys):
    ckpt = _from_step_4(muon_run, tmp_path / "c")
    adamw = train_cmd(demo_data, ckpt, STEPS, "--set", "model.fused_projections=true", ckpt_every=4)
    assert train_here([*adamw, "--resume-from-latest"]) == 2
    err = capsys.readouterr().err
    assert "optim.name=muon" in err and "optim.name=adamw" in err and "--reset-optimizer" in err
    assert not (ckpt / "final.safetensors").exists()
    assert train_here([*adamw, "--resume-from-latest", "--reset-optimizer"]) == 0
    out = capsys.readouterr().out
    assert "--reset-optimizer: the muon state (" in out and "momentum_buffer" in out and "exp_avg" in out
    assert "resuming from" in out and (ckpt / "final.safetensors").exists()
    assert "format" not in ck.load_optimizer(ckpt / "step_0000008")  # AdamW's own state from then on


def test_a_muon_runs_fused_weights_export_to_transformers_with_the_same_logits(muon_run, tmp_path):
    """The export reads only the weights: a Muon run's (fused q/k/v and gate/up, split for Llama) load in
    transformers and give x1's logits."""
    transformers = pytest.importorskip("transformers")
    from x1_pretrain.export_hf import main as export
    from x1_pretrain.report.ckpt_source import load_model, resolve

    assert export(["--checkpoint", str(muon_run), "--output", str(tmp_path / "hf")]) == 0
    ours = load_model(resolve(muon_run / "final.safetensors"))
    assert ours.config.fused_projections
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, ours(idx), atol=1e-5, rtol=1e-5)


def test_the_muon_lab_config_is_the_lab_config_with_muon():
    """configs/x1-50m-muon.yaml changes only the optimizer; at a reduced shape it builds Muon + AdamW."""
    repo = TINY.parents[1]
    lab, muon = C.load(repo / "configs" / "x1-50m-a100.yaml"), C.load(repo / "configs" / "x1-50m-muon.yaml")
    changed = {k for k, _, _ in C.diff(lab.to_dict(), muon.to_dict())}
    assert "optim.name" in changed and all(k == "optim.name" or k.startswith("optim.muon_") for k in changed)
    small = C.load(
        repo / "configs" / "x1-50m-muon.yaml", sets=["model.n_layer=1", "model.d_model=96", "model.d_ff=128"]
    )
    assert isinstance(build_optimizer(Transformer(small.model), small, CPU), MuonAdamW)
