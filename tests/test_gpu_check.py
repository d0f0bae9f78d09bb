from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_without_a_gpu_says_so_and_exits_0(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OUT": str(tmp_path)}  # the CPU path even on a GPU host
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu_check.sh")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GPU detected" in proc.stdout and "CPU smoke" in proc.stdout
    table = (tmp_path / "gpu_check.md").read_text()
    assert "No CUDA GPU detected" in table and "| torch |" in table
    assert "| eager | SDPA | 2 |" in table and "ok (smoke)" in table
    assert "## bf16 vs fp32" in table
