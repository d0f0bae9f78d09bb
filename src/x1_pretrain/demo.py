"""``make demo``: the whole job end to end on the built-in demo corpus, on whatever device is here.

1. write CPython's pydoc topics as a parquet shard (real English prose every Python install carries),
2. tokenize it with the lab's command,
3. train the tiny config with the lab's train command, logging to MLflow.

Everything lands in ``demo-run/`` (or ``--out``); run it again to start over.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from .demo_corpus import write_demo_corpus

REPO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "x1-tiny-cpu.yaml"


def _run(cmd: list[str]) -> int:
    print("\n$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m x1_pretrain.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("demo-run"))
    ap.add_argument("--config", type=Path, default=REPO_CONFIG)
    ap.add_argument("--total-steps", type=int, default=300)
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    shard = write_demo_corpus(out / "raw")
    print(f"[demo] demo corpus: {shard}")
    py = sys.executable
    data, ckpt, mlruns = out / "data", out / "checkpoints", out / "mlruns"
    code = _run([py, "-m", "x1_pretrain.tokenize_data", "--input-dir", str(out / "raw"), "--output-dir", str(data),
                 "--tokenizer", "gpt2", "--val-fraction", "0.1", "--workers", "2"])
    if code != 0:
        return code
    code = _run([py, "-m", "x1_pretrain.train", "--config", str(args.config), "--data-dir", str(data),
                 "--ckpt-dir", str(ckpt), "--mlflow-uri", mlruns.as_uri(), "--total-steps", str(args.total_steps),
                 "--ckpt-every", "100", "--eval-every", "50", "--log-every", "10"])
    if code != 0:
        return code
    print(f"\n[demo] done. Look at the run with:\n  MLFLOW_ALLOW_FILE_STORE=true .venv/bin/mlflow ui "
          f"--backend-store-uri {mlruns.as_uri()}   (needs the UI extra: .venv/bin/pip install -e '.[ui]')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
