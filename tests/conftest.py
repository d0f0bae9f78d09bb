"""Shared fixtures. Everything here is generated or taken from text every Python install carries;
``../shared/data`` is used only for optional cross-checks."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def _share_the_cores() -> None:
    """Each test worker gets its share of the cores for torch's thread pools, and so does every process a test
    starts (they inherit the variable). Two workers that each ran one thread per core on a 2-core machine
    oversubscribed it: two tiny 60-step runs side by side took 66 s instead of 28 s. Set before torch loads."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # a serial run (or xdist's controller): torch's own default
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    per_worker = str(max(1, (os.cpu_count() or 1) // workers))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, per_worker)


_share_the_cores()


def _tune_allocator() -> None:
    # The trainer does this itself on a CPU (core.env.keep_freed_memory); the test process trains in-process
    # too, and the models it builds directly (ckpt_utils, the HF comparisons) profit the same way.
    from x1_pretrain.core.env import keep_freed_memory

    keep_freed_memory()


_tune_allocator()


@pytest.fixture(autouse=True)
def log_lines():
    """x1's log lines on the console at INFO for each test, as a command sets them up (a test that runs a command
    in this process with another --log-level changes them for itself only)."""
    from x1_pretrain.core.log import setup

    setup("info")


@pytest.fixture(autouse=True)
def no_hard_exit(monkeypatch):
    """A run inside the test process must not reach a hard exit (the budget's exit-now, the stop deadline):
    ``os._exit`` would kill the pytest worker and hide why. Here it is recorded instead (with the thread and
    the stack), the thread that asked goes on, and the test fails naming it. Forked children exit for real."""
    real, pid, calls = os._exit, os.getpid(), []

    def record(code: int) -> None:
        if os.getpid() != pid:
            real(code)
        calls.append(
            f"os._exit({code}) on thread {threading.current_thread().name}:\n"
            + "".join(traceback.format_stack(limit=10))
        )

    monkeypatch.setattr(os, "_exit", record)
    yield calls
    assert not calls, "a run in the test process asked for a hard exit:\n" + "\n".join(calls)


# --- a migrated, empty MLflow sqlite store, made once and copied where a test run would create one ------
# Creating a sqlite store runs MLflow's ~50 schema migrations (~3 s on the dev machine); a copy of an empty
# migrated store is the same database. Runs that pass --mlflow-uri are untouched.
_TEMPLATE: dict[str, Path] = {}


def _template_db(root: Path) -> Path:
    if "db" not in _TEMPLATE:
        from filelock import FileLock

        db = root / "mlflow-template.db"
        with FileLock(str(db) + ".lock"):
            if not db.is_file():
                from mlflow import MlflowClient

                tmp = root / f".mlflow-template-{os.getpid()}.db"
                MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments()
                os.replace(tmp, db)
        _TEMPLATE["db"] = db
    return _TEMPLATE["db"]


def seed_store(ckpt: Path) -> Path:
    """Give a new checkpoint dir the trainer's default store (ckpt/mlflow.db), already migrated."""
    import shutil

    ckpt.mkdir(parents=True, exist_ok=True)
    if not (ckpt / "mlflow.db").exists() and "db" in _TEMPLATE:
        shutil.copyfile(_TEMPLATE["db"], ckpt / "mlflow.db")
    return ckpt


def shared_root(tmp_path_factory) -> Path:
    """A directory every xdist worker of this session sees (the session's own base dir without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_build(tmp_path_factory, name: str, build) -> Path:
    """``build(dir)`` once per test session, whichever worker asks first; the others wait and reuse it.
    What is built is read-only for the tests (they copy what they change)."""
    from filelock import FileLock

    root = shared_root(tmp_path_factory)
    target = root / "shared" / name
    with FileLock(str(root / f"shared-{name}.lock")):
        if not (target / ".built").is_file():
            import shutil

            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / ".built").write_text("ok\n")
    return target


@pytest.fixture(scope="session", autouse=True)
def seeded_sqlite_stores(tmp_path_factory):
    """In-process runs that create their default sqlite store get a copy of the migrated template."""
    from x1_pretrain.trainer import tracking

    _template_db(shared_root(tmp_path_factory))
    original = tracking.resolve_uri

    def resolve(uri, ckpt_dir):
        if not uri:
            with contextlib.suppress(OSError):  # an unwritable dir: let the trainer report it
                seed_store(Path(ckpt_dir))
        return original(uri, ckpt_dir)

    tracking.resolve_uri = resolve
    import x1_pretrain.launch.build as build

    build.resolve_uri = resolve
    yield
    tracking.resolve_uri = original
    build.resolve_uri = original


def shared_path(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test when the checkout has none."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (optional cross-check)")
    return p


@pytest.fixture(scope="session")
def tok():
    from x1_pretrain.data.tokenizer import load_gpt2

    return load_gpt2(allow_download=False)


@pytest.fixture(scope="session")
def prose() -> list[str]:
    from x1_pretrain.data.demo_corpus import demo_documents

    return demo_documents()


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory) -> Path:
    """The demo corpus tokenized once per session (val 10% so eval has windows)."""
    from x1_pretrain import tokenize_data
    from x1_pretrain.data.demo_corpus import write_demo_corpus

    root = tmp_path_factory.mktemp("demo")
    write_demo_corpus(root / "raw")
    code = tokenize_data.main(
        ["--input-dir", str(root / "raw"), "--output-dir", str(root / "tok"), "--val-fraction", "0.1", "--workers", "1"]
    )
    assert code == 0
    return root / "tok"


TINY = REPO / "configs" / "x1-tiny-cpu.yaml"
# Fast settings for tests: short sequences, few steps, frequent logs.
FAST = ["--set", "model.seq_len=32", "--set", "train.eval_batches=2", "--set", "optim.warmup_steps=2"]


SPIKE_ARGS = ["--total-steps", "60", "--log-every", "20"]


STDLIB_CODE = ("bisect", "fnmatch", "heapq", "shlex", "string", "textwrap", "colorsys", "glob")
BPE_VOCAB = 2048


def write_code_corpus(directory: Path) -> list[str]:
    """Python source from the standard library, one document a module (``*.txt``): a second, unlike source."""
    import importlib

    directory.mkdir(parents=True, exist_ok=True)
    docs = []
    for name in STDLIB_CODE:
        text = Path(importlib.import_module(name).__file__).read_text(encoding="utf-8")
        (directory / f"{name}.txt").write_text(text, encoding="utf-8")
        docs.append(text)
    return docs


@pytest.fixture(scope="session")
def bpe_data(tmp_path_factory) -> Path:
    """The demo corpus plus stdlib Python sources, tokenized once with a byte-level BPE of 2,048 ids trained
    on them (``--train-tokenizer``; val 10%)."""
    from x1_pretrain import tokenize_data
    from x1_pretrain.data.demo_corpus import write_demo_corpus

    root = tmp_path_factory.mktemp("bpe")
    write_demo_corpus(root / "raw" / "prose")
    write_code_corpus(root / "raw" / "code")
    args = ["--input-dir", str(root / "raw"), "--output-dir", str(root / "tok"), "--val-fraction", "0.1"]
    code = tokenize_data.main([*args, "--workers", "1", "--train-tokenizer", "--vocab-size", str(BPE_VOCAB)])
    assert code == 0
    return root / "tok"


@pytest.fixture(scope="session")
def spiked_run(demo_data, tmp_path_factory) -> Path:
    """A tiny run with --inject-spike-at-step 40 (checkpoint dir with its sqlite MLflow store)."""
    from x1_pretrain import train

    def build(d: Path) -> None:
        assert (
            train.main(
                [
                    "--config",
                    str(TINY),
                    "--data-dir",
                    str(demo_data),
                    *SPIKE_ARGS,
                    *FAST,
                    "--ckpt-dir",
                    str(d / "ckpt"),
                    "--inject-spike-at-step",
                    "40",
                ]
            )
            == 0
        )

    return shared_build(tmp_path_factory, "spiked", build) / "ckpt"


@pytest.fixture(scope="session")
def clean_run(demo_data, tmp_path_factory) -> Path:
    """The same run without an injection."""
    from x1_pretrain import train

    def build(d: Path) -> None:
        assert (
            train.main(
                ["--config", str(TINY), "--data-dir", str(demo_data), *SPIKE_ARGS, *FAST, "--ckpt-dir", str(d / "ckpt")]
            )
            == 0
        )

    return shared_build(tmp_path_factory, "clean", build) / "ckpt"


# 24 steps instead of 60: the detector's baseline is 8 steps (not 20), so the injection at step 12 is already a
# spike it flags; clipping at 0.25 (not 1.0) engages on the spike steps as the lab config's does at its scale.
SHORT_SPIKE_ARGS = [
    "--total-steps",
    "24",
    "--log-every",
    "20",
    "--inject-spike-at-step",
    "12",
    "--set",
    "spike.baseline_steps=8",
    "--set",
    "optim.grad_clip=0.25",
]


@pytest.fixture(scope="session")
def short_spiked_run(demo_data, tmp_path_factory) -> Path:
    """A tiny run with --inject-spike-at-step 12 (SHORT_SPIKE_ARGS; checkpoint dir with its sqlite MLflow store)."""
    from x1_pretrain import train

    def build(d: Path) -> None:
        assert (
            train.main(
                [
                    "--config",
                    str(TINY),
                    "--data-dir",
                    str(demo_data),
                    *SHORT_SPIKE_ARGS,
                    *FAST,
                    "--ckpt-dir",
                    str(d / "ckpt"),
                ]
            )
            == 0
        )

    return shared_build(tmp_path_factory, "short-spiked", build) / "ckpt"


# -- a real S3 server (moto's, with IAM authentication) on 127.0.0.1, one per test worker ----------------------
_s3_prefixes = itertools.count()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    from .s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.close()


@pytest.fixture
def s3env(s3, monkeypatch):
    """This process sees the server through the standard AWS variables; returns ``s3://BUCKET/PREFIX`` unused
    by any other test."""
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    from .s3server import BUCKET

    return f"s3://{BUCKET}/run-{next(_s3_prefixes)}-{id(monkeypatch) % 100000}"
