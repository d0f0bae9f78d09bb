"""Device selection and the hardware checks, on this CPU with the CUDA queries faked where a GPU is needed."""

from __future__ import annotations

import pytest
import torch

from x1_pretrain.core import config as C
from x1_pretrain.core.errors import X1Error
from x1_pretrain.model import transformer
from x1_pretrain.trainer import device as D

from ..conftest import TINY


def lab_like(**train: object) -> C.Config:
    return C.load(TINY, {f"train.{k}": v for k, v in train.items()})


class FakeCuda:
    """torch.cuda as a machine with GPUs would answer, for the checks that only ask."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int] = (9, 0), name: str = "NVIDIA H100 80GB HBM3"
    ) -> None:
        self.selected: list[torch.device] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "set_device", self.selected.append)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: name)


def test_auto_is_the_cpu_without_a_gpu_and_cuda_without_one_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert D.resolve_device("auto") == torch.device("cpu")
    assert D.resolve_device("cpu", local_rank=1, world_size=2) == torch.device("cpu")
    with pytest.raises(X1Error, match=r"train.device 'cuda:0': no CUDA device is visible .* use --device cpu"):
        D.resolve_device("cuda")


def test_each_rank_takes_the_gpu_of_its_local_rank(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    assert D.resolve_device("auto", local_rank=0, world_size=1) == torch.device("cuda:0")
    assert D.resolve_device("cuda", local_rank=3, world_size=8) == torch.device("cuda:3")
    assert D.resolve_device("cuda:1", local_rank=2, world_size=4) == torch.device("cuda:2")  # one GPU a rank
    assert D.resolve_device("cuda:1") == torch.device("cuda:1")  # one process: the GPU it names
    assert cuda.selected == [torch.device(f"cuda:{i}") for i in (0, 3, 2, 1)]


def test_flash_attention_falls_back_to_sdpa_with_the_reason(monkeypatch):
    log: list[str] = []
    cfg = lab_like(attention="flash", precision="bf16")
    assert D.hardware_plan(cfg, torch.device("cpu"), log.append) is False
    assert "needs a CUDA device" in log[-1]
    FakeCuda(monkeypatch, capability=(8, 0), name="NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(transformer, "flash_available", lambda: False)
    assert D.hardware_plan(cfg, torch.device("cuda:0"), log.append) is False
    assert "flash-attn is not importable (pip install flash-attn" in log[-1]
    monkeypatch.setattr(transformer, "flash_available", lambda: True)
    assert D.hardware_plan(cfg, torch.device("cuda:0"), log.append) is True
    assert D.hardware_plan(lab_like(attention="flash", precision="fp32"), torch.device("cuda:0"), log.append) is False
    assert "needs bf16/fp16" in log[-1]
    assert D.hardware_plan(lab_like(attention="sdpa", precision="bf16"), torch.device("cuda:0"), log.append) is False


def test_bf16_on_a_gpu_older_than_ampere_is_refused_with_the_fix(monkeypatch):
    FakeCuda(monkeypatch, capability=(7, 0), name="Tesla V100-SXM2-16GB")
    with pytest.raises(X1Error, match=r"Tesla V100.* has no bf16 support; use --set train.precision=fp32"):
        D.hardware_plan(lab_like(precision="bf16"), torch.device("cuda:0"), [].append)
    log: list[str] = []
    assert D.hardware_plan(lab_like(precision="fp32", attention="flash"), torch.device("cuda:0"), log.append) is False
    assert "needs an Ampere-or-newer GPU" in log[-1]


def test_the_forward_kernels_follow_the_config():
    log: list[str] = []
    k = D.forward_kernels(
        lab_like(precision="fp32", bf16_residual=True, loss_chunk_tokens=256), torch.device("cpu"), False, log.append
    )
    assert (k.use_flash, k.fused_loss, k.loss_chunk_tokens, k.residual_dtype) == (False, True, 256, None)
    assert "train.bf16_residual has no effect" in log[-1]
    k = D.forward_kernels(
        lab_like(precision="bf16", bf16_residual=True, fused_loss=False), torch.device("cpu"), False, log.append
    )
    assert (k.fused_loss, k.residual_dtype) == (False, torch.bfloat16)


def test_seeding_repeats_every_generator():
    import random

    import numpy as np

    D.seed_everything(7)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    D.seed_everything(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_deterministic_under_compile_without_inductors_deterministic_mode_is_refused_on_a_gpu(monkeypatch):
    """torch 2.5 has no torch._inductor.config.deterministic: on a GPU, train.deterministic with compile is a
    usage error naming the ways out, never a silently non-deterministic run; eager, or a CPU, goes ahead."""
    import torch._inductor.config as inductor_config

    cfg = C.load(TINY, {"train.deterministic": True, "train.compile": True})
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    if hasattr(inductor_config, "deterministic"):
        D.check_deterministic_compile(cfg, gpu)  # this torch has it: nothing to refuse
        monkeypatch.delattr(inductor_config, "deterministic")
    with pytest.raises(X1Error, match=r"train\.deterministic with train\.compile") as e:
        D.check_deterministic_compile(cfg, gpu)
    assert "--no-compile" in str(e.value) and torch.__version__ in str(e.value)
    D.check_deterministic_compile(cfg, cpu)
    D.check_deterministic_compile(C.load(TINY, {"train.deterministic": True, "train.compile": False}), gpu)
    D.check_deterministic_compile(C.load(TINY, {"train.compile": True}), gpu)


def test_cudnn_attention_is_off_on_a_gpu_unless_asked_for(monkeypatch):
    calls: list[bool] = []
    FakeCuda(monkeypatch)
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    D.hardware_plan(lab_like(attention="sdpa", precision="bf16"), torch.device("cuda:0"), [].append)
    D.hardware_plan(lab_like(attention="sdpa", precision="bf16", sdpa_cudnn=True), torch.device("cuda:0"), [].append)
    D.hardware_plan(lab_like(attention="sdpa"), torch.device("cpu"), [].append)  # a CPU has no cuDNN to pick
    assert calls == [False, True]


def test_the_attention_tag_names_the_kernel_sdpa_dispatches_to():
    """The tag is SDPA's own choice for the model's shapes: restricted to the math kernel, it says math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from x1_pretrain.launch.run_record import attention_effective
    from x1_pretrain.model.transformer import SDPA_BACKENDS, Transformer, sdpa_backend

    cfg = lab_like()
    model = Transformer(cfg.model)
    got = attention_effective(model, "fp32")
    assert got.startswith("sdpa:") and got[5:] in SDPA_BACKENDS.values()
    with sdpa_kernel([SDPBackend.MATH]):
        assert sdpa_backend(cfg.model, torch.float32, torch.device("cpu")) == "math"
        assert attention_effective(model, "bf16") == "sdpa:math"
    model.set_attention(True)
    assert attention_effective(model, "bf16") == "flash-attn"


def test_compiling_uses_the_x1_cache_and_shares_the_hosts_cpus_between_its_ranks(monkeypatch, tmp_path):
    """Eight ranks on a 16-CPU host get 2 compile threads each; the cache is x1's, on the persistent disk, unless
    the user set one; an explicit thread count is kept."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(D.os, "environ", dict(D.os.environ))  # what prepare_compile writes stays in this test
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"):
        D.os.environ.pop(var, None)
    monkeypatch.setenv("X1_CACHE_DIR", str(tmp_path / "x1cache"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(D.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(inductor_config, "compile_threads", inductor_config.compile_threads)  # restored after
    log: list[str] = []
    D.prepare_compile(log.append)
    assert D.os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "x1cache" / "inductor")
    assert D.os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "2" and inductor_config.compile_threads == 2
    assert "2 compile threads for each of the 8 ranks" in log[-1]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "5")
    D.prepare_compile(log.append)
    assert D.os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine") and inductor_config.compile_threads == 5
