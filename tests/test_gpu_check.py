"""bench/gpu_check.sh on a machine without a usable GPU: every phase as a CPU smoke (the real trainer CLI
included), a hard failure when the driver sees a GPU that torch cannot use, and per-phase deadlines that keep
what a phase measured before it was killed."""

from __future__ import annotations

import argparse
import importlib
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
    no_driver = tmp_path / "bin"  # even on a GPU host: a driver that lists no GPU
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
    assert list(phases) == [
        "report",
        "trainer",
        "grads",
        "graph-breaks",
        "bf16-vs-fp32",
        "ab-eager",
        "optimizer-ab",
        "ab-compiled",
        "profile",
        "trainer-lab-mode",
    ]
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
    opt_ab = phases["optimizer-ab"]["data"]  # AdamW and Muon from one init on real GPT-2 ids of real text
    assert [r["arm"] for r in opt_ab["rows"]] == ["AdamW (config as is)", "Muon (x1-50m-muon.yaml)"]
    assert "pydoc_data.topics" in opt_ab["data"] and opt_ab["steps"] == 4
    first = [r["curve"]["1"] for r in opt_ab["rows"]]
    assert abs(first[0] - first[1]) < 0.05 and first[0] != first[1]  # same init and batch, one step apart
    assert "## Optimizer A/B: AdamW against Muon" in table


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
    assert [p["phase"] for p in report["phases"]] == ["report"]  # no CPU numbers passed off as a GPU's
    assert report["phases"][0]["status"].startswith("FAILED")


def _gpu_check(module: str = "gpu_check"):
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(BENCH))


def _args(gpu_check, **kw) -> argparse.Namespace:
    base = dict(
        config=gpu_check.LAB_CONFIG,
        max_steps=4,
        measure_s=1.0,
        trainer_steps=5_000,
        cut_after_steps=None,
        phase="trainer",
        phase_budget_s=60.0,
        ab_data=None,
    )
    return argparse.Namespace(**{**base, **kw})


def test_the_trainer_phase_stopped_at_its_deadline_ends_itself_and_says_so(tmp_path):
    """5,000 tiny steps cannot end within the phase: the phase stops the trainer itself (12 s before the end of
    its budget, the orchestrator's timeout less 10 s) and reports it as cut, whatever it had measured by then. A
    phase that finishes in its own process (bf16-vs-fp32, the smoke's quickest) is reported ok with its data."""
    gpu_check = _gpu_check()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "X1_GPU_CHECK_TMP": str(tmp_path)}  # the phase's scratch
    log = tmp_path / "child.log"
    log.write_text("")
    slow = gpu_check.run_child("trainer", _args(gpu_check), timeout_s=32.0, log=log, env=env)
    assert "cut by its deadline" in slow.status and "of 5000 steps" in slow.status, slow.status
    assert slow.wall_s < 32  # it ended itself: the orchestrator's kill was not needed
    assert "--total-steps 5000" in slow.data["command"] and slow.data["cut"] == "its deadline"
    assert not list(tmp_path.glob("x1-gpu-check-trainer-*"))  # its scratch removed
    done = gpu_check.run_child("bf16-vs-fp32", _args(gpu_check), timeout_s=120.0, log=log, env=env)
    assert done.status == "ok" and [r["run"] for r in done.data["rows"]] == ["fp32", "bf16", "bf16 + bf16 residual"]


def test_a_cut_trainer_keeps_its_warm_speed_mfu_and_step_time(tmp_path, monkeypatch):
    """The trainer stopped once it reported step 10 (the event the test waits on; a deadline takes the same path):
    its warm speed, step time and first-step time come from the progress file it wrote while it ran."""
    gpu_check = _gpu_check()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("X1_GPU_CHECK_TMP", str(tmp_path))
    import torch

    out = gpu_check.Partial(tmp_path / "result.json")
    gpu_check.phase_trainer(_args(gpu_check, cut_after_steps=10, phase_budget_s=600.0), torch.device("cpu"), out)
    d = json.loads((tmp_path / "result.json").read_text())
    fig = d["figures"]
    assert d["cut"] == "--cut-after-steps 10" and d["ok"] is True and d["exit_code"] is None
    assert fig["steps_done"] >= 10 and fig["tokens_per_s"] > 0 and fig["first_step_s"] > 0
    assert fig["warm_steps"] >= 5  # two warm progress records at least (written every 5 steps: 5 and 10)
    assert "cut by --cut-after-steps 10 after" in gpu_check.phase_status(
        d, "ok"
    ) and "of 5000 steps" in gpu_check.phase_status(d, "ok")


def test_trainer_figures_from_progress_samples():
    """Steps 1 (compile) and 2 are not warm; from step 5 at t=10 s to step 15 at t=30 s: 2 s a step."""
    gpu_check = _gpu_check()
    samples = [(1, 0.0), (2, 6.0), (5, 10.0), (10, 20.0), (15, 30.0)]
    fig = gpu_check.trainer_figures(
        samples, tokens_per_step=1000, flops_honest=6_000, flops_lab=3_000, peak_tflops=1e-6
    )
    assert fig["step_s"] == 2.0 and fig["tokens_per_s"] == 500.0 and fig["warm_steps"] == 10
    assert fig["mfu"] == pytest.approx(500 * 6_000 / 1e6) and fig["mfu_lab_6n"] == pytest.approx(fig["mfu"] / 2)
    assert gpu_check.trainer_figures(samples[:3], 1000, 6_000, 3_000, None) == {}  # one warm sample: no speed
    assert "mfu" not in gpu_check.trainer_figures(samples, 1000, 6_000, 3_000, None)
    # the run's last step (after its final val loss and checkpoint) is left out where two warm samples remain
    slow_end = [(5, 10.0), (10, 20.0), (15, 40.0)]
    assert gpu_check.trainer_figures(slow_end, 1000, 6_000, 3_000, None, last_step=15)["step_s"] == 2.0
    assert gpu_check.trainer_figures(slow_end, 1000, 6_000, 3_000, None)["step_s"] == 3.0
    assert gpu_check.trainer_figures(slow_end[::2], 1000, 6_000, 3_000, None, last_step=15)["step_s"] == 3.0


def test_phase_deadlines_are_overridden_by_name(capsys):
    gpu_check = _gpu_check()
    assert gpu_check.parse_phase_s(["trainer=300", "profile=10"]) == {"trainer": 300.0, "profile": 10.0}
    assert gpu_check.main(["--phase-s", "trainr=300"]) == 2
    assert "one of trainer, grads" in capsys.readouterr().err
    assert gpu_check.main(["--phase-s", "trainer=-1"]) == 2


@pytest.mark.parametrize(
    "name,group",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "GEMM"),
        ("flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, cutlass::bfloat16_t>>", "attention"),
        ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
        ("triton_red_fused_exp_logsumexp_sub_0", "loss"),
        ("void at::native::multi_tensor_apply_kernel<FusedAdamW>", "optimizer"),
        ("triton_poi_fused_add_mul_silu_3", "elementwise/other"),
    ],
)
def test_profile_groups_kernel_names(name, group):
    assert _gpu_check().kernel_group(name) == group


def test_the_optimizer_ab_reads_a_tokenize_data_dir_and_refuses_one_without_meta(demo_data, tmp_path, capsys):
    """--ab-data: the lab's own tokens settle the default; a directory that is not tokenize_data output is exit 2."""
    import torch

    gpu_check = _gpu_check()
    assert gpu_check.main(["--ab-data", str(tmp_path)]) == 2
    assert f"--ab-data {tmp_path}: no meta.json" in capsys.readouterr().err
    gpu_check_optim = _gpu_check("gpu_check_optim")
    args = argparse.Namespace(config=gpu_check.LAB_CONFIG, ab_data=demo_data, started_unix=None, phase_budget_s=30)
    out = gpu_check.Partial(None)
    gpu_check_optim.phase_optimizer_ab(args, torch.device("cpu"), out)
    assert out.data["data"].startswith(str(demo_data)) and out.data["ok"] is True
    assert [len(r["curve"]) for r in out.data["rows"]] == [4, 4]
