from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from x1_pretrain import train
from x1_pretrain.core.config import load as load_config
from x1_pretrain.core.contract import EXIT_DIVERGED, EXIT_SLOW, EXIT_USAGE
from x1_pretrain.model.flops import flops_per_token

from ..conftest import FAST, REPO, TINY
from ..procs import SMALL_BATCH

KEYS = [
    "train/loss",
    "train/lr",
    "train/grad_norm",
    "train/param_norm",
    "train/tokens_per_s",
    "train/mfu",
    "train/mfu_lab_6n",
    "train/step_time_s",
    "train/tokens_seen",
]


def mlflow_run(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("x1-pretraining")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
    return client, runs[0]


def history(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_metrics_params_and_tags_at_every_log_step(demo_data, tmp_path, capsys):
    """Also: both MFU figures, labelled, with --peak-tflops; --checkpoint-every-min checkpoints by the clock when
    --ckpt-every (here 1000 steps) never comes."""
    ckpt = tmp_path / "ckpt"
    code = train.main(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(demo_data),
            "--ckpt-dir",
            str(ckpt),
            "--total-steps",
            "12",
            "--log-every",
            "4",
            "--eval-every",
            "6",
            "--peak-tflops",
            "1.0",
            "--ckpt-every",
            "1000",
            "--checkpoint-every-min",
            "0.0001",
            *FAST,
            *SMALL_BATCH,
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    uri = f"sqlite:///{ckpt.resolve()}/mlflow.db"
    client, run = mlflow_run(uri)
    assert run.info.status == "FINISHED"
    for key in KEYS:
        assert set(history(client, run.info.run_id, key)) == {1, 4, 8, 12}, key
    f = flops_per_token(load_config(TINY, sets=["model.seq_len=32"]).model)
    mfu, lab = history(client, run.info.run_id, "train/mfu"), history(client, run.info.run_id, "train/mfu_lab_6n")
    assert all(lab[s] / mfu[s] == pytest.approx(f.lab_6n / f.honest) for s in mfu) and 0 < mfu[12] < 1
    assert re.search(r"MFU +\d+\.\d% honest, lab 6N +\d+\.\d%", out)
    saves = history(client, run.info.run_id, "checkpoint/save_s")
    assert len([s for s in saves if s < 12]) >= 3  # by the clock: more than the final save
    val = history(client, run.info.run_id, "val/loss")
    assert set(val) == {0, 6, 12}
    assert val[12] < val[0]
    tokens = history(client, run.info.run_id, "train/tokens_seen")
    assert tokens[12] == 12 * 4 * 32  # SMALL_BATCH: 4 sequences of 32 tokens a step
    p = run.data.params
    assert p["model.n_layer"] == "2" and p["train.seed"] == "42" and p["world_size"] == "1"
    assert len(p["config_sha256"]) == 64 and p["version.torch"]
    assert run.data.tags["host"] == socket.gethostname() and "cpu" in run.data.tags["device"]
    assert run.data.tags["compile_mode_effective"] == "off"
    arts = [a.path for a in client.list_artifacts(run.info.run_id, "config")]
    assert len(arts) == 1 and arts[0].endswith(".yaml")


def test_lab_file_store_uri_works_without_the_env_var(demo_data, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    mlruns = tmp_path / "mlruns"
    code = train.main(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(demo_data),
            "--ckpt-dir",
            str(tmp_path / "c"),
            "--mlflow-uri",
            mlruns.as_uri(),
            "--total-steps",
            "3",
            "--log-every",
            "10",
            *FAST,
            *SMALL_BATCH,
        ]
    )
    assert code == 0
    assert "MLFLOW_ALLOW_FILE_STORE" in capsys.readouterr().err
    client, run = mlflow_run(mlruns.as_uri())
    assert set(history(client, run.info.run_id, "train/loss")) == {1, 3}


def test_unreachable_tracking_server_does_not_stop_training(demo_data, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("X1_MLFLOW_CLOSE_TIMEOUT_S", "2")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = train.main(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(demo_data),
            "--ckpt-dir",
            str(tmp_path / "c"),
            "--mlflow-uri",
            f"http://127.0.0.1:{port}",
            "--total-steps",
            "3",
            *FAST,
            *SMALL_BATCH,
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "unreachable" in err and "training continues" in err
    spilled = list((tmp_path / "c").glob("mlflow-undelivered-*.jsonl"))
    assert len(spilled) == 1
    keys = {json.loads(line)["key"] for line in spilled[0].read_text().splitlines()}
    assert {"train/loss", "val/loss"} <= keys


def test_nan_loss_stops_with_exit_5_naming_the_step(demo_data, tmp_path, capsys):
    code = train.main(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(demo_data),
            "--ckpt-dir",
            str(tmp_path / "c"),
            "--total-steps",
            "20",
            "--set",
            "optim.lr=1e30",
            "--set",
            "optim.min_lr=0",
            *FAST,
            *SMALL_BATCH,
        ]
    )
    assert code == EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "diverged" in err and "at step" in err and "No checkpoint" in err
    assert not list((tmp_path / "c").glob("step_*"))


def test_config_errors_come_before_reading_data(tmp_path, capsys):
    code = train.main(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(tmp_path / "no-data"),
            "--set",
            "model.n_head=5",
            "--set",
            "train.batch_size=7",
        ]
    )
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "model.d_model: 64 is not divisible by model.n_head 5" in err and "train.batch_size" in err
    assert "no-data" not in err and "Traceback" not in err


def test_bad_data_dir_is_a_usage_error(tmp_path, capsys):
    assert train.main(["--config", str(TINY), "--data-dir", str(tmp_path / "none")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err


def test_throughput_floor_exits_6_in_the_first_hour_and_warns_once_after_it(demo_data, tmp_path, capsys):
    floor = [
        "--total-steps",
        "6",
        "--log-every",
        "1",
        "--min-tokens-per-s",
        "1e12",
        "--set",
        "train.throughput_window=3",
        *FAST,
        *SMALL_BATCH,
    ]
    base = ["--config", str(TINY), "--data-dir", str(demo_data)]
    code = train.main([*base, "--ckpt-dir", str(tmp_path / "c"), *floor])
    assert code == EXIT_SLOW  # the lab's floor, inside its first hour (the default window)
    assert "below --min-tokens-per-s 1,000,000,000,000: stopping to diagnose (exit 6)" in capsys.readouterr().err
    code = train.main([*base, "--ckpt-dir", str(tmp_path / "d"), *floor, "--min-tokens-per-s-window-min", "0"])
    err = capsys.readouterr().err  # a warning: on standard error
    assert code == 0 and err.count("WARNING trainer.loop: ") == 1  # one warning for one episode
    assert err.count("training goes on (diagnose it") == 1
    code = train.main(
        [
            *base,
            "--ckpt-dir",
            str(tmp_path / "e"),
            *floor,
            "--min-tokens-per-s-window-min",
            "0",
            "--min-tokens-per-s-always",
        ]
    )
    assert code == EXIT_SLOW


def test_lab_command_as_a_real_process(demo_data, tmp_path):
    """The lab's flags, spelled as in the lab text, with the tiny config."""
    env = {**os.environ}
    env.pop("MLFLOW_ALLOW_FILE_STORE", None)
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.train",
        "--config",
        str(TINY),
        "--data-dir",
        str(demo_data),
        "--ckpt-dir",
        str(tmp_path / "checkpoints"),
        "--mlflow-uri",
        (tmp_path / "mlruns").as_uri(),
        "--total-steps",
        "4",
        "--ckpt-every",
        "2",
        "--eval-every",
        "2",
        "--log-every",
        "10",
        *FAST,
        *SMALL_BATCH,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "step       4/4" in r.stdout and "val loss" in r.stdout


@pytest.mark.parametrize("flag", ["--compile"])
def test_compile_flag_is_accepted(flag):
    args = train.build_parser().parse_args(["--config", "c", "--data-dir", "d", flag])
    assert args.compile is True
