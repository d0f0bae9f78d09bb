"""What the users' container (nvcr.io/nvidia/pytorch:24.10-py3: Python 3.10, torch 2.5.0a0+…nv24.10,
flash-attn 2) needs from us, checked on whichever torch runs the suite (both CI lanes run this file)."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import get_args, get_type_hints

import torch
from packaging.requirements import Requirement

from x1_pretrain.core.config import TrainConfig
from x1_pretrain.report.hf_export import transformers_hint
from x1_pretrain.trainer.device import WITHOUT_CUDA_GRAPHS

from .conftest import REPO

CONTAINER_TORCH = "2.5.0a0+e000c0c.nv24.10"


def torch_requirement() -> Requirement:
    text = (REPO / "pyproject.toml").read_text()
    (spec,) = re.findall(r'^\s*"(torch[^"]*)"', text, re.M)
    return Requirement(spec)


def test_the_containers_prerelease_torch_satisfies_the_install_requirement():
    req = torch_requirement()
    assert req.specifier.contains(CONTAINER_TORCH), f"{req} would make pip replace the container's torch"
    assert req.specifier.contains("2.5.1") and not req.specifier.contains("2.4.1")
    assert req.specifier.contains(torch.__version__.split("+")[0])


def test_every_compile_mode_we_use_is_one_this_torch_knows():
    import torch._inductor as inductor

    known = set(inductor.list_mode_options())
    modes = set(get_args(get_type_hints(TrainConfig)["compile_mode"]))
    assert modes and modes | set(WITHOUT_CUDA_GRAPHS.values()) <= known, sorted(modes - known)


def test_a_broken_flash_attn_install_falls_back_to_sdpa(tmp_path):
    """The container's flash-attn can fail to import against another torch (an undefined symbol): the model
    must still import and run, on SDPA."""
    pkg = tmp_path / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise OSError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')\n")
    code = (
        "import torch; from x1_pretrain.model import transformer as t; assert not t.flash_available(); "
        "q = torch.randn(1, 2, 4, 8); print(t.causal_attention(q, q, q, use_flash=True).shape)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch.Size([1, 2, 4, 8])" in r.stdout


def test_the_transformers_hint_follows_the_torch_version():
    for old in (CONTAINER_TORCH, "2.5.1", "2.5.1+cu124"):
        hint = transformers_hint(old)
        assert hint is not None and "transformers>=4.44,<5" in hint and "[hf-torch25]" in hint
    assert transformers_hint("2.6.0") is None and transformers_hint("2.13.0") is None


def _make_test_compat_without_python310(tmp_path, ci: str) -> subprocess.CompletedProcess:
    """``make test-compat`` on a machine where no Python 3.10 can be found (a PATH and HOME without one)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CI": ci}
    if subprocess.run([str(REPO / ".ci" / "python310")], env=env, capture_output=True).returncode == 0:
        import pytest

        pytest.skip("this machine has a Python 3.10 outside pyenv (.ci/python310 finds it)")
    return subprocess.run(
        ["make", "--no-print-directory", "test-compat"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_ci_fails_the_compat_lane_when_no_python310_exists(tmp_path):
    r = _make_test_compat_without_python310(tmp_path, "true")
    assert r.returncode != 0 and "FAILED: CI=true but no Python 3.10" in r.stderr
    r = _make_test_compat_without_python310(tmp_path, "")
    assert r.returncode == 0 and "SKIPPED" in r.stdout
