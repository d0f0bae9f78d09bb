"""The compile path's correctness guards, on CPU: no CUDA graphs under accumulation, an eager eval, a loud
fallback, and no graph break inside the model (the SDPA path; gpu_check counts them on a GPU)."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import torch

from x1_pretrain.core import config as C
from x1_pretrain.model.transformer import Kernels, Transformer, state_dict_for_saving
from x1_pretrain.trainer.device import (
    CompileFallback,
    compile_model,
    effective_compile_mode,
    effective_compile_scope,
    forward_kernels,
    make_deterministic,
)
from x1_pretrain.trainer.loop import Run, evaluate

from ..conftest import TINY


def test_cuda_graph_modes_are_never_used_under_gradient_accumulation():
    assert effective_compile_mode("max-autotune", 16)[0] == "max-autotune-no-cudagraphs"
    assert effective_compile_mode("reduce-overhead", 2)[0] == "default"
    _, why = effective_compile_mode("max-autotune", 16)
    assert why is not None and "16 micro-steps" in why and "pytorch/pytorch#169545" in why
    assert effective_compile_mode("max-autotune", 1) == ("max-autotune", None)  # no accumulation: as asked
    assert effective_compile_mode("default", 16) == ("default", None)


def test_ddp_with_accumulation_compiles_the_blocks_on_a_torch_whose_whole_graph_is_wrong_there(monkeypatch):
    """torch 2.5.1 compiles a DDP model's whole graph with a wrong embedding gradient across micro-steps (the
    2-rank compile test shows it): there the blocks are compiled instead, and the log says why."""
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    scope, why = effective_compile_scope("model", 2, 2)
    assert scope == "blocks" and why is not None and "2.5.1" in why and "2 micro-steps per rank" in why
    assert effective_compile_scope("model", 1, 8) == ("model", None)  # no accumulation: exact as it is
    assert effective_compile_scope("model", 4, 1) == ("model", None)  # one process: no DDP
    assert effective_compile_scope("blocks", 4, 2) == ("blocks", None)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert effective_compile_scope("model", 4, 2) == ("model", None)


def test_a_compile_failure_is_loud_reported_once_and_training_goes_on_eagerly():
    calls, logs, reports = [], [], []

    def compiled(x):
        calls.append("compiled")
        raise RuntimeError("BackendCompilerFailed: inductor exploded\nlong trace")

    def eager(x):
        calls.append("eager")
        return x * 2

    f = CompileFallback(compiled, eager, logs.append, reports.append)
    assert f(3) == 6 and f(4) == 8
    assert calls == ["compiled", "eager", "eager"]  # never tried again
    assert reports == ["RuntimeError: BackendCompilerFailed: inductor exploded"]
    assert len(logs) == 1 and logs[0].startswith("WARNING: torch.compile failed") and "EAGERLY" in logs[0]


def tiny_run(model: Transformer, forward) -> Run:
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=g)
    return Run(
        cfg=cfg,
        model=forward,
        raw_model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        device=torch.device("cpu"),
        batches=iter(()),
        chunks=[0],
        val_batches=[(x, torch.roll(x, 1, 1))],
        flops_per_token=1,
        peak_tflops=None,
    )


def test_eval_runs_the_plain_module_never_the_compiled_one():
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    model = Transformer(cfg.model)

    def compiled(*a):
        raise AssertionError("the eval called the compiled model (its first graph would be an inference one)")

    run = tiny_run(model, compiled)
    x, y = run.val_batches[0]
    with torch.no_grad():
        expected = float(model(x, y))
    assert evaluate(run) == pytest.approx(expected, rel=1e-6) and model.training  # fp64 sum of fp32 per-token nats


def test_eval_runs_blocks_compiled_in_place_eagerly_and_leaves_them_compiled():
    """compile_scope blocks compiles the plain module's blocks in place: the step-0 eval must not be their
    first compiled call (nor fail in a compile the fallback cannot see)."""
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    model = Transformer(cfg.model)

    def compiled(*a, **k):
        raise AssertionError("the eval entered a compiled block")

    for b in model.model.layers:
        b._compiled_call_impl = compiled
    run = tiny_run(model, compiled)
    x, y = run.val_batches[0]
    value = evaluate(run)
    assert all(b._compiled_call_impl is compiled for b in model.model.layers)
    for b in model.model.layers:
        b._compiled_call_impl = None
    with torch.no_grad():
        assert value == pytest.approx(float(model(x, y)), rel=1e-6)  # fp64 sum of fp32 per-token nats


def test_the_model_compiles_as_one_graph_without_breaks():
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    model = Transformer(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, torch.roll(x, 1, 1))
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.mark.parametrize("variant", [{}, {"fused_projections": True}])
@pytest.mark.parametrize("bf16", [False, True])
def test_every_kernel_switch_traces_as_one_graph(variant, bf16):
    """The one-pass loss (an autograd.Function with a chunk loop), the padded head, fused projections and a bf16
    residual under autocast: still one graph, no break, for the whole model and for one block (scope blocks)."""
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    model = Transformer(dataclasses.replace(cfg.model, **variant))
    model.set_kernels(Kernels(fused_loss=True, loss_chunk_tokens=12, residual_dtype=torch.bfloat16 if bf16 else None))
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with ctx:
        torch._dynamo.reset()
        whole = torch._dynamo.explain(model)(x, torch.roll(x, 1, 1))
        torch._dynamo.reset()
        block = torch._dynamo.explain(model.model.layers[0])(
            torch.randn(2, 16, cfg.model.d_model), model.rope_cos[:16], model.rope_sin[:16]
        )
    for e in (whole, block):
        assert (e.graph_count, e.graph_break_count) == (1, 0), [str(b.reason) for b in e.break_reasons]


def test_block_scope_compiles_each_block_fullgraph_and_a_failure_goes_back_to_eager(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # not the user's cache
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    with torch.no_grad():
        expected = model(x, torch.roll(x, 1, 1))
    logs, reports = [], []
    forward = compile_model(model, model, "default", "blocks", logs.append)
    forward.on_fallback = reports.append
    assert all(b._compiled_call_impl is not None for b in model.model.layers)  # compiled in place
    assert set(state_dict_for_saving(model)) == set(state_dict_for_saving(Transformer(cfg.model)))  # no _orig_mod

    def broken(*a, **k):
        raise RuntimeError("Unsupported: graph break in fullgraph mode")

    for b in model.model.layers:  # what a fullgraph failure looks like at the first call
        b._compiled_call_impl = broken
    with torch.no_grad():
        got = forward(x, torch.roll(x, 1, 1))
    assert torch.equal(got, expected)
    assert all(b._compiled_call_impl is None for b in model.model.layers)
    assert reports == ["RuntimeError: Unsupported: graph break in fullgraph mode"] and "EAGERLY" in logs[-1]


def test_compiled_flash_attn_that_breaks_graphs_is_swapped_for_sdpa(monkeypatch):
    from x1_pretrain.model import transformer

    cfg = C.load(TINY, sets=["train.compile=true", "train.bf16_residual=true"])
    logs: list[str] = []
    monkeypatch.setattr(transformer, "flash_attn_func", lambda *a, **k: None)  # "importable", not a custom op
    k = forward_kernels(cfg, torch.device("cpu"), use_flash=True, log=logs.append)
    assert not k.use_flash and any("SDPA's flash backend" in m for m in logs)
    assert k.residual_dtype is None and any("bf16_residual has no effect" in m for m in logs)  # tiny is fp32
    cpu = torch.device("cpu")
    eager = forward_kernels(
        C.load(TINY, sets=["train.precision=bf16", "train.bf16_residual=true"]), cpu, True, logs.append
    )
    assert eager.use_flash and eager.residual_dtype == torch.bfloat16 and eager.fused_loss
    # deterministic: a flash-attn without a deterministic backward is not used; one with it is kept under compile
    logs.clear()
    det = C.load(TINY, sets=["train.compile=true", "train.deterministic=true"])
    assert not forward_kernels(det, cpu, True, logs.append).use_flash and "no deterministic backward" in logs[0]

    def flash_with_flag(q, k, v, dropout_p=0.0, causal=False, deterministic=False):
        return None

    monkeypatch.setattr(transformer, "flash_attn_func", flash_with_flag)
    logs.clear()
    kept = forward_kernels(det, cpu, True, logs.append)
    assert kept.use_flash and kept.deterministic and "keeps flash-attn's deterministic backward" in logs[0]


def test_deterministic_mode_sets_every_switch():
    import torch._inductor.config as inductor_config

    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    inductor_before = getattr(inductor_config, "deterministic", None)
    logs: list[str] = []
    try:
        make_deterministic(torch.device("cpu"), logs.append)
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in (":4096:8", ":16:8")
        assert "deterministic mode" in logs[0]
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, before[1]
        if inductor_before is not None:
            inductor_config.deterministic = inductor_before


class _FailingBackward(torch.autograd.Function):
    """What AOTAutograd does when it lowers the backward lazily and Inductor fails: the forward ran, the
    first ``.backward()`` raises."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("BackendCompilerFailed: backend='inductor' raised: LoweringException in the backward")


def test_a_backward_compile_failure_redoes_the_step_eagerly_like_a_forward_failure():
    """Two micro-batches; the 'compiled' model's backward fails at the second. The step is redone eagerly from
    its first micro-batch: the same loss, gradient norm and weights as a run that was eager from the start, a
    loud log line, one report (the tag and the alert), and the compiled path never tried again."""
    from x1_pretrain.data.tokens import Batch
    from x1_pretrain.trainer.loop import train_step
    from x1_pretrain.trainer.schedule import planned

    cfg = C.load(TINY, sets=["model.seq_len=16"])
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, 1000, (2, 17), generator=g) for _ in range(2)]
    calls = []

    def make(fail: bool):
        torch.manual_seed(0)
        model = Transformer(cfg.model)
        logs, reports = [], []

        def compiled(x, y):
            calls.append("compiled")
            loss = model(x, y)
            return _FailingBackward.apply(loss) if len(calls) == 2 else loss

        forward = CompileFallback(compiled, model, logs.append, reports.append) if fail else model
        batches = iter([Batch(0, c, d[:, :-1], d[:, 1:]) for c, d in enumerate(data)])
        run = Run(
            cfg=cfg,
            model=forward,
            raw_model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            device=torch.device("cpu"),
            batches=batches,
            chunks=[0, 1],
            val_batches=[],
            flops_per_token=1,
            peak_tflops=None,
            horizon=planned(10, cfg.optim),
        )
        return run, model, logs, reports

    run, model, logs, reports = make(fail=True)
    got = train_step(run, 0)
    ref_run, ref_model, _, _ = make(fail=False)
    want = train_step(ref_run, 0)
    assert got[0] == pytest.approx(want[0], abs=1e-6) and got[1] == pytest.approx(want[1], rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name
    assert calls == ["compiled", "compiled"]  # the failed try, then eager only
    assert reports == [
        "RuntimeError in the backward: BackendCompilerFailed: backend='inductor' raised: "
        "LoweringException in the backward"
    ]
    assert len(logs) == 1 and "EAGERLY" in logs[0]


def test_a_backward_failure_that_is_not_the_compilers_passes_through_and_ddp_stops_with_the_fix():
    """A lost peer in the backward is not a compile failure: no fallback, the error as it is. Under DDP a backward
    compile failure cannot be redone in the process (the gradient hooks fired part-way): reported, then exit 2
    with the fix."""
    from x1_pretrain.core.errors import X1Error

    class Fails(torch.autograd.Function):
        message = ""

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError(Fails.message)

    x = torch.ones(2, requires_grad=True)
    logs, reports = [], []
    f = CompileFallback(lambda *a: None, lambda *a: None, logs.append, reports.append)
    Fails.message = "Connection closed by peer [127.0.0.1]:29500"
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        f.backward(Fails.apply(x).sum())
    assert f.failed is None and reports == [] and logs == []
    f.distributed = True
    Fails.message = "BackendCompilerFailed: backend='inductor' raised: LoweringException"
    with pytest.raises(X1Error, match=r"under DDP .* Relaunch with --no-compile"):
        f.backward(Fails.apply(x).sum())
    assert len(reports) == 1 and "in the backward" in reports[0] and "EAGERLY" in logs[0]
