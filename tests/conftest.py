"""Shared fixtures. Everything here is generated or taken from text every Python install carries;
``../shared/data`` is used only for optional cross-checks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def shared_path(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test when the checkout has none."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (optional cross-check)")
    return p


@pytest.fixture(scope="session")
def tok():
    from x1_pretrain.tokenizer import load_gpt2

    return load_gpt2(allow_download=False)


@pytest.fixture(scope="session")
def prose() -> list[str]:
    from x1_pretrain.demo_corpus import demo_documents

    return demo_documents()


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> Path:
    """The demo corpus tokenized once per session (val 10% so eval has windows)."""
    from x1_pretrain import tokenize_data
    from x1_pretrain.demo_corpus import write_demo_corpus

    root = tmp_path_factory.mktemp("demo")
    write_demo_corpus(root / "raw")
    code = tokenize_data.main(["--input-dir", str(root / "raw"), "--output-dir", str(root / "tok"),
                               "--val-fraction", "0.1", "--workers", "1"])
    assert code == 0
    return root / "tok"


TINY = REPO / "configs" / "x1-tiny-cpu.yaml"
# Fast settings for tests: short sequences, few steps, frequent logs.
FAST = ["--set", "model.seq_len=32", "--set", "train.eval_batches=2", "--set", "optim.warmup_steps=2"]


SPIKE_ARGS = ["--total-steps", "60", "--log-every", "20"]


@pytest.fixture(scope="session")
def spiked_run(demo_data, tmp_path_factory) -> Path:
    """A tiny run with --inject-spike-at-step 40 (checkpoint dir with its sqlite MLflow store)."""
    from x1_pretrain import train

    ckpt = tmp_path_factory.mktemp("spiked") / "ckpt"
    assert train.main(["--config", str(TINY), "--data-dir", str(demo_data), *SPIKE_ARGS, *FAST,
                       "--ckpt-dir", str(ckpt), "--inject-spike-at-step", "40"]) == 0
    return ckpt


@pytest.fixture(scope="session")
def clean_run(demo_data, tmp_path_factory) -> Path:
    """The same run without an injection."""
    from x1_pretrain import train

    ckpt = tmp_path_factory.mktemp("clean") / "ckpt"
    assert train.main(["--config", str(TINY), "--data-dir", str(demo_data), *SPIKE_ARGS, *FAST,
                       "--ckpt-dir", str(ckpt)]) == 0
    return ckpt
