"""bench/gpu_check.sh on a machine without a usable GPU: every phase as a CPU smoke (the real trainer CLI
included), a hard failure when the driver sees a GPU that torch cannot use, and per-phase deadlines that keep
what a phase measured before it was killed."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def run_check(tmp_path: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path), **env_extra}  # the CPU path on any host
    return subprocess.run(["bash", str(BENCH / "gpu_check.sh")], capture_output=True, text=True, env=env, timeout=300)


def test_without_a_gpu_every_phase_runs_as_a_smoke_and_it_exits_0(tmp_path):
    no_driver = tmp_path / "bin"     # even on a GPU host: a driver that lists no GPU
    no_driver.mkdir()
    (no_driver / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (no_driver / "nvidia-smi").chmod(0o755)
    proc = run_check(tmp_path, {"PATH": f"{no_driver}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no GPU detected" in proc.stdout and "CPU smoke run finished" in proc.stdout
    table = (tmp_path / "gpu_check.md").read_text()
    assert "No CUDA GPU detected" in table and "| torch |" in table
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    phases = {p["phase"]: p for p in report["phases"]}
    assert list(phases) == ["report", "grads", "graph-breaks", "bf16-vs-fp32", "trainer", "ab-eager", "ab-compiled",
                            "profile"]
    assert report["smoke"] is True
    assert all(p["status"].startswith(("ok", "skipped")) for p in phases.values()), phases
    trainer = phases["trainer"]["data"]
    assert trainer["exit_code"] == 0 and "-m x1_pretrain.train" in trainer["command"]
    assert trainer["metrics"]["train/tokens_per_s"] > 0 and trainer["metrics"]["train/first_step_s"] > 0
    assert trainer["tags"]["attention_effective"].startswith("sdpa:")
    assert "vocab rows 50304 for 50257" in trainer["tags"]["kernels"]
    breaks = phases["graph-breaks"]["data"]["rows"]
    assert [(r["graphs"], r["breaks"]) for r in breaks] == [(1, 0), (1, 0)]
    rows = {r["variant"]: r for r in phases["ab-eager"]["data"]["rows"]}
    assert next(iter(rows)).startswith("baseline") and "one-pass loss off" in rows and "vocab padding off" in rows
    assert rows["deterministic on"]["repeatable"] is True and rows["baseline (config as is)"]["repeatable"] is True
    assert sum(phases["profile"]["data"]["groups_ms"].values()) > 0
    assert [r["run"] for r in phases["bf16-vs-fp32"]["data"]["rows"]] == ["fp32", "bf16", "bf16 + bf16 residual"]
    assert "## The real trainer" in table and "## A/B of the speed switches" in table


def test_a_gpu_the_driver_sees_but_torch_cannot_use_fails_the_check(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0000)'\n")
    smi.chmod(0o755)
    proc = run_check(tmp_path, {"PATH": f"{fake}:{os.environ['PATH']}"})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "nvidia-smi sees 1 GPU(s)" in proc.stdout and "torch" in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [p["phase"] for p in report["phases"]] == ["report"]          # no CPU numbers passed off as a GPU's
    assert report["phases"][0]["status"].startswith("FAILED")


def test_a_phase_past_its_deadline_is_killed_and_keeps_what_it_measured(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    # 5,000 tiny steps (over 50 ms each here) cannot end within the deadline, and 30 s leave time for the imports
    # and the synthetic data (about 1.5 s idle) even on a loaded machine: the kill lands while the trainer runs
    args = argparse.Namespace(config=gpu_check.LAB_CONFIG, max_steps=4, measure_s=1.0, trainer_steps=5_000)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "X1_GPU_CHECK_TMP": str(tmp_path)}   # the killed phase's scratch
    log = tmp_path / "child.log"
    log.write_text("")
    slow = gpu_check.run_child("trainer", args, timeout_s=30.0, log=log, env=env)
    assert slow.status.startswith("timed out after 30 s") and slow.wall_s < 60
    assert "-m x1_pretrain.train" in slow.data.get("command", "")                  # written before the trainer ran
    assert "--total-steps 5000" in slow.data["command"]
    done = gpu_check.run_child("graph-breaks", args, timeout_s=120.0, log=log, env=env)
    assert done.status == "ok" and done.data["rows"][0]["breaks"] == 0


@pytest.mark.parametrize("name,group", [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "GEMM"),
                                        ("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, cutlass::bfloat16_t>>",
                                         "attention"),
                                        ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
                                        ("triton_red_fused_exp_logsumexp_sub_0", "loss"),
                                        ("void at::native::multi_tensor_apply_kernel<FusedAdamW>", "optimizer"),
                                        ("triton_poi_fused_add_mul_silu_3", "elementwise/other")])
def test_profile_groups_kernel_names(name, group):
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(BENCH))
    assert gpu_check.kernel_group(name) == group
