"""The device a process trains on, what it supports (bf16, flash-attn), seeding, the forward's kernels,
deterministic mode, and torch.compile."""

from __future__ import annotations

import contextlib
import os
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..core.errors import X1Error
from ..core.log import Log


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str, local_rank: int = 0, world_size: int = 1) -> Any:
    """The device of this process; under torchrun on GPUs, the GPU of its local rank."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" or (world_size > 1 and name.startswith("cuda")):
        name = f"cuda:{local_rank}"  # each rank its own GPU; set_device needs an index
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise X1Error(
            f"train.device {name!r}: no CUDA device is visible (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda}); use --device cpu or check nvidia-smi"
        )
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev


def hardware_plan(cfg: Any, device: Any, log: Log) -> bool:
    """Check precision/attention against the device; returns whether flash-attn will be used."""
    import torch

    from ..model.transformer import flash_available

    # Ampere (compute capability 8.0) or newer: is_bf16_supported() also counts emulated bf16 on older GPUs,
    # and flash-attn 2 refuses them at the first forward.
    ampere = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)
    if cfg.train.precision == "bf16" and device.type == "cuda" and not ampere:
        raise X1Error(
            f"train.precision 'bf16': {torch.cuda.get_device_name(device)} has no bf16 support; "
            "use --set train.precision=fp32 (slower) or an Ampere-or-newer GPU"
        )
    if device.type == "cuda" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(cfg.train.sdpa_cudnn)  # chosen on purpose, never by torch's default
    if cfg.train.attention != "flash":
        return False
    if device.type != "cuda":
        log("warning: train.attention 'flash' needs a CUDA device; using PyTorch SDPA on the CPU")
        return False
    if not ampere:
        log(
            f"warning: flash-attn needs an Ampere-or-newer GPU ({torch.cuda.get_device_name(device)} is older); "
            "using PyTorch SDPA"
        )
        return False
    if not flash_available():
        log(
            "warning: flash-attn is not importable (pip install flash-attn==2.6.3 --no-build-isolation, or use "
            "nvcr.io/nvidia/pytorch:24.10-py3); falling back to PyTorch SDPA"
        )
        return False
    if cfg.train.precision != "bf16":
        log("warning: flash-attn needs bf16/fp16 tensors; with train.precision fp32 attention uses SDPA")
        return False
    return True


# Inductor modes that capture CUDA graphs, and the same mode without them. CUDA graphs under gradient
# accumulation overwrite their static outputs between micro-steps: "accessing tensor output of CUDAGraphs
# that has been overwritten" in backward, or silently wrong sums (pytorch/pytorch #169545, #96693).
WITHOUT_CUDA_GRAPHS = {"max-autotune": "max-autotune-no-cudagraphs", "reduce-overhead": "default"}


def effective_compile_mode(mode: str, micro_steps: int) -> tuple[str, str | None]:
    """(the mode to compile with, why it is not ``mode`` or None) for ``micro_steps`` per optimizer step."""
    if micro_steps > 1 and mode in WITHOUT_CUDA_GRAPHS:
        use = WITHOUT_CUDA_GRAPHS[mode]
        return use, (
            f"train.compile_mode {mode} captures CUDA graphs, which are not safe with gradient "
            f"accumulation ({micro_steps} micro-steps per optimizer step; pytorch/pytorch#169545): "
            f"compiling with {use}"
        )
    return mode, None


# The first torch on which a whole-model graph compiled under DDP with gradient accumulation was checked exact
# (tests/trainer/test_distributed.py); torch 2.5.1 gets the token embedding's gradient wrong there (~1e-2).
DDP_WHOLE_GRAPH_TORCH = (2, 13)


def effective_compile_scope(scope: str, micro_steps: int, ranks: int) -> tuple[str, str | None]:
    """(the scope to compile, why it is not ``scope`` or None). Under DDP with more than one micro-step per
    optimizer step, a torch older than :data:`DDP_WHOLE_GRAPH_TORCH` compiles the blocks only: its whole-model
    graph accumulates a wrong embedding gradient across micro-steps (torch 2.5.1, also with DDP's optimizer off),
    while compiled blocks with the embedding and the loss eager are exact."""
    import torch

    version = tuple(int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    if scope != "model" or ranks < 2 or micro_steps < 2 or version >= DDP_WHOLE_GRAPH_TORCH:
        return scope, None
    return "blocks", (
        f"train.compile_scope model -> blocks: torch {torch.__version__} compiles a DDP model's whole "
        f"graph with a wrong token-embedding gradient under gradient accumulation ({micro_steps} "
        "micro-steps per rank; seen on 2.5.1, ~1e-2 off), so each block is compiled and the "
        "embedding and the loss run eagerly (exact); torch >= "
        f"{'.'.join(map(str, DDP_WHOLE_GRAPH_TORCH))} keeps the whole graph"
    )


def is_compile_error(e: BaseException) -> bool:
    """Whether ``e`` comes from torch.compile's machinery (Dynamo, AOTAutograd, Inductor, Triton)."""
    module = type(e).__module__ or ""
    text = f"{type(e).__name__}: {e}"
    if "out of memory" in text.lower():
        return False
    return module.startswith(("torch._dynamo", "torch._inductor", "torch._functorch", "triton")) or any(
        word in text for word in ("BackendCompilerFailed", "Inductor", "inductor", "dynamo", "Triton", "triton")
    )


class CompileFellBack(Exception):
    """The compiled step failed after its forward (AOTAutograd compiles the backward at the first ``.backward()``):
    the loop redoes the step eagerly from its first micro-batch."""


class CompileFallback:
    """Calls the compiled model; if compilation fails, says so loudly (console, ``on_fallback`` for the MLflow
    tag and the alert) and carries on eagerly, which ``--min-tokens-per-s`` then judges. The backward goes
    through :meth:`backward`, so a failure compiling it falls back the same way."""

    def __init__(
        self,
        compiled: Any,
        eager: Any,
        log: Log,
        on_fallback: Callable[[str], None] | None = None,
        undo: Callable[[], None] | None = None,
    ) -> None:
        self.compiled, self.eager, self.log, self.on_fallback = compiled, eager, log, on_fallback
        self.undo = undo  # for a compilation made in place (compile_scope blocks): back to eager
        self.failed: str | None = None
        self.distributed = False  # under DDP a failed backward cannot be redone in this process (see backward)

    def __call__(self, *a: Any, **k: Any) -> Any:
        if self.failed is not None:
            return self.eager(*a, **k)
        try:
            return self.compiled(*a, **k)
        except Exception as e:  # torch._dynamo / inductor raise many types
            if "out of memory" in str(e).lower():
                raise
            self._fall_back(e, "")
            return self.eager(*a, **k)

    def backward(self, loss: Any) -> None:
        """``loss.backward()``; a failure while compiling the backward falls back to eager and raises
        :class:`CompileFellBack` for the loop to redo the step (the gradients so far are not to be kept). Under
        DDP the ranks' gradient hooks may have fired part-way, so the step cannot be redone in this process: the
        failure is reported the same way and ends the run with exit 2 and the fix. Errors that are not the
        compiler's (a lost peer, a CUDA fault, out of memory) pass through untouched."""
        if self.failed is not None:
            loss.backward()
            return
        try:
            loss.backward()
        except Exception as e:
            if not is_compile_error(e):
                raise
            self._fall_back(e, " in the backward")
            if self.distributed:
                raise X1Error(
                    f"torch.compile failed while compiling the backward under DDP ({self.failed}); the "
                    "step cannot be redone in this process. Relaunch with --no-compile (or "
                    "--set train.compile_mode=default), and report the torch version"
                ) from e
            raise CompileFellBack(self.failed) from e

    def _fall_back(self, e: BaseException, where: str) -> None:
        self.failed = f"{type(e).__name__}{where}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        if self.undo is not None:
            self.undo()
        self.log(
            f"WARNING: torch.compile failed ({self.failed}); training goes on EAGERLY, typically ~1.7x "
            "slower on a GPU: fix the cause or relaunch with --no-compile (--min-tokens-per-s stops a run "
            "that falls below the floor in its first hour)"
        )
        if self.on_fallback is not None:
            try:
                self.on_fallback(self.failed)
            except Exception as report_error:  # reporting must not end the run
                self.log(f"warning: the compile fallback could not be reported ({report_error})")

    def train(self, mode: bool = True) -> Any:
        return self.eager.train(mode)

    def eval(self) -> Any:
        return self.eager.eval()


def forward_kernels(cfg: Any, device: Any, use_flash: bool, log: Log) -> Any:
    """How the model's forward runs for this config (``model.transformer.Kernels``). Under torch.compile a
    flash-attn that is not a torch custom op (before 2.7) would break the graph at every attention call, so
    the compiled model uses SDPA, whose flash backend runs the same kind of kernel inside the graph."""
    import torch

    from ..model.transformer import Kernels, flash_compiles, flash_has_deterministic_backward

    t = cfg.train
    if use_flash and t.deterministic and not flash_has_deterministic_backward():
        log(
            "warning: train.deterministic: this flash-attn has no deterministic backward (flash-attn >= 2.4.1 has); "
            "attention uses PyTorch SDPA"
        )
        use_flash = False
    elif use_flash and t.deterministic and t.compile and not flash_compiles():
        log(
            "train.deterministic keeps flash-attn's deterministic backward under torch.compile, although this "
            "flash-attn build breaks the graph at every attention call (slower: bench/gpu_check.sh measures it)"
        )
    elif use_flash and t.compile and not flash_compiles():
        log(
            "attention: this flash-attn build breaks torch.compile's graph at every call (it is not a torch custom "
            "op before flash-attn 2.7); the compiled model uses PyTorch SDPA's flash backend instead"
        )
        use_flash = False
    if t.deterministic and not use_flash and device.type == "cuda":
        log(
            "note: train.deterministic with SDPA attention: whether its backward is deterministic depends on the "
            "torch build (on a CPU it is); bench/gpu_check.sh's A/B checks that gradients repeat bit for bit"
        )
    residual = None
    if t.bf16_residual:
        if t.precision == "bf16":
            residual = torch.bfloat16
        else:
            log(f"note: train.bf16_residual has no effect with train.precision {t.precision!r}")
    return Kernels(
        use_flash=use_flash,
        fused_loss=t.fused_loss,
        loss_chunk_tokens=t.loss_chunk_tokens,
        residual_dtype=residual,
        deterministic=t.deterministic,
    )


def make_deterministic(device: Any, log: Log) -> None:
    """``train.deterministic``: deterministic kernels wherever torch has them, so that a GPU resume can be
    bitwise. cuBLAS needs its workspace setting before its first handle (this runs before the model is built);
    an op without a deterministic kernel warns once instead of ending a paid run."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    _inductor_deterministic(True)
    log(
        f"deterministic mode on {device.type}: deterministic algorithms (an op without one warns), cuDNN without "
        f"benchmarking, CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}; with flash-attn its "
        "deterministic backward"
    )


def undo_deterministic() -> None:
    """make_deterministic's switches off again (the cuBLAS workspace setting stays: it is read once)."""
    import torch

    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    _inductor_deterministic(False)


def _inductor_has_deterministic() -> bool:
    try:
        import torch._inductor.config as inductor_config
    except ImportError:
        return False
    return hasattr(inductor_config, "deterministic")


def _inductor_deterministic(on: bool) -> None:
    if _inductor_has_deterministic():  # newer torch: no autotuning choices that vary between runs
        import torch._inductor.config as inductor_config

        inductor_config.deterministic = on


def check_deterministic_compile(cfg: Any, device: Any) -> None:
    """``train.deterministic`` with ``train.compile`` on a GPU needs Inductor's deterministic mode: without it
    (torch 2.5) Inductor benchmarks kernel configurations when it compiles and may pick another reduction order
    after a resume, so the promise could not be kept. Refused (exit 2) with the ways out, never silently."""
    import torch

    t = cfg.train
    if not (t.deterministic and t.compile and device.type == "cuda") or _inductor_has_deterministic():
        return
    raise X1Error(
        f"train.deterministic with train.compile needs torch.compile's deterministic mode "
        f"(torch._inductor.config.deterministic), which torch {torch.__version__} does not have: Inductor "
        "picks its kernels by timing them, so a resumed run may sum in another order. Train eagerly "
        "(--no-compile, or --set train.compile=false), drop --set train.deterministic=true, or use a "
        "torch that has it"
    )


def compiled_in_place(model: Any) -> list[Any]:
    """The submodules ``Module.compile`` compiled in place (compile_scope blocks): their ``_compiled_call_impl``
    is the compiled forward; None is the eager one."""
    return [m for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None]


@contextlib.contextmanager
def eager_modules(model: Any) -> Iterator[None]:
    """Submodules compiled in place run their plain forward inside the block, and are compiled again after it."""
    stash = [(m, m._compiled_call_impl) for m in compiled_in_place(model)]
    for m, _ in stash:
        m._compiled_call_impl = None
    try:
        yield
    finally:
        for m, compiled in stash:
            m._compiled_call_impl = compiled


def inductor_cache() -> Any:
    """Where Inductor keeps what it compiled: ``$TORCHINDUCTOR_CACHE_DIR``, else ``<x1 cache>/inductor``
    (``~/.cache/x1_pretrain/inductor``) rather than torch's ``/tmp/torchinductor_<user>``: on the persistent disk,
    so a restart, a relaunch by the watchdog and the paid run after ``bench/gpu_check.sh`` find it warm."""
    from pathlib import Path

    from ..data.tokenizer import cache_dir

    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or cache_dir() / "inductor")


def prepare_compile(log: Log) -> None:
    """Before compiling: Inductor (and its FX-graph and AOTAutograd caches) at :func:`inductor_cache`, and its
    compile workers shared out between the ranks of this host (``LOCAL_WORLD_SIZE``), so that eight ranks do not
    each start a pool as large as the machine. An explicit ``TORCHINDUCTOR_COMPILE_THREADS`` is kept."""
    path = inductor_cache()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    if threads is None and ranks > 1:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = str(max(1, cpus // ranks))
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = threads
    if threads is not None:
        with contextlib.suppress(ImportError, AttributeError):
            import torch._inductor.config as inductor_config

            inductor_config.compile_threads = int(threads)
    log(
        f"torch.compile cache: {path} (warm after a first compile of this config on this machine)"
        + (f"; {threads} compile threads for each of the {ranks} ranks on this host" if ranks > 1 else "")
    )


def compile_model(model: Any, forward: Any, mode: str, scope: str, log: Log) -> CompileFallback:
    """torch.compile as ``train.compile_scope`` says: ``model`` compiles what forward runs as one graph;
    ``blocks`` compiles each transformer block on its own with ``fullgraph=True`` (a graph break is an error,
    reported by the fallback, never a silent slowdown; the blocks share one compiled graph) and leaves the
    embedding and the one-pass loss eager."""
    import torch

    prepare_compile(log)
    if scope == "blocks":
        for block in model.model.layers:
            block.compile(mode=mode, fullgraph=True)

        def uncompile() -> None:
            for m in compiled_in_place(model):
                m._compiled_call_impl = None

        return CompileFallback(forward, forward, log, undo=uncompile)
    return CompileFallback(torch.compile(forward, mode=mode), forward, log)
