"""The compile path's correctness guards, on CPU: no CUDA graphs under accumulation, an eager eval, a loud
fallback, and no graph break inside the model (the SDPA path; gpu_check counts them on a GPU)."""

from __future__ import annotations

import torch

from x1_pretrain.core import config as C
from x1_pretrain.model.transformer import Transformer
from x1_pretrain.training.device import CompileFallback, effective_compile_mode
from x1_pretrain.training.loop import Run, evaluate

from ..conftest import TINY


def test_cuda_graph_modes_are_never_used_under_gradient_accumulation():
    assert effective_compile_mode("max-autotune", 16)[0] == "max-autotune-no-cudagraphs"
    assert effective_compile_mode("reduce-overhead", 2)[0] == "default"
    _, why = effective_compile_mode("max-autotune", 16)
    assert why is not None and "16 micro-steps" in why and "pytorch/pytorch#169545" in why
    assert effective_compile_mode("max-autotune", 1) == ("max-autotune", None)   # no accumulation: as asked
    assert effective_compile_mode("default", 16) == ("default", None)


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
    assert calls == ["compiled", "eager", "eager"]               # never tried again
    assert reports == ["RuntimeError: BackendCompilerFailed: inductor exploded"]
    assert len(logs) == 1 and logs[0].startswith("WARNING: torch.compile failed") and "EAGERLY" in logs[0]


def tiny_run(model: Transformer, forward) -> Run:
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=g)
    return Run(cfg=cfg, model=forward, raw_model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
               device=torch.device("cpu"), batches=iter(()), chunks=[0], val_batches=[(x, torch.roll(x, 1, 1))],
               flops_per_token=1, peak_tflops=None)


def test_eval_runs_the_plain_module_never_the_compiled_one():
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    model = Transformer(cfg.model)

    def compiled(*a):
        raise AssertionError("the eval called the compiled model (its first graph would be an inference one)")

    run = tiny_run(model, compiled)
    x, y = run.val_batches[0]
    with torch.no_grad():
        expected = float(model(x, y))
    assert evaluate(run) == expected and model.training


def test_the_model_compiles_as_one_graph_without_breaks():
    cfg = C.load(TINY, sets=["model.seq_len=16"])
    model = Transformer(cfg.model)
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, torch.roll(x, 1, 1))
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1
