from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import struct
from pathlib import Path

import pytest

from x1_pretrain import export_run
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import config as C
from x1_pretrain.core.contract import EXIT_USAGE
from x1_pretrain.core.errors import X1Error
from x1_pretrain.model import flops
from x1_pretrain.report import bundle, manifest, runs

from ..conftest import FAST, TINY
from ..run_bundle import RESTARTS, SPENT_AT_EXPORT, SPENT_IN_CHECKPOINT, STEPS, BuiltRun, build, train_overrides


@pytest.fixture(scope="session")
def built(tmp_path_factory, demo_data) -> BuiltRun:
    return build(tmp_path_factory, demo_data)


@pytest.fixture(scope="module")
def mlflow_run(built):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=built.uri)
    exp = client.get_experiment_by_name("x1-pretraining")
    (run,) = client.search_runs([exp.experiment_id])
    return client, run


def read_manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def test_bundle_holds_exactly_the_lab_files_and_no_temporary_dirs(built):
    assert sorted(p.name for p in built.bundle.iterdir()) == sorted(bundle.BUNDLE_FILES)
    assert [p.name for p in built.bundle.parent.iterdir()] == ["run-cloud"]
    assert "exported run" in built.export_stdout and "1 restart(s)" in built.export_stdout


def test_manifest_fields_are_present_and_true(built, mlflow_run):
    import torch

    client, run = mlflow_run
    m = read_manifest(built.bundle)
    cfg = C.load(TINY, train_overrides(), FAST[1::2])
    assert m["seed"] == 42
    assert m["config_sha256"] == cfg.sha256() and m["config"] == cfg.to_dict()
    v = m["versions"]
    assert v["torch"] == torch.__version__ and v["python"] and v["numpy"] and v["mlflow"]
    assert {"cuda", "flash_attn", "transformers", "x1_pretrain", "x1_pretrain_git_commit"} <= set(v)
    cl = m["cluster"]
    assert cl["hostname"] == socket.gethostname() and cl["cpu_count"] == os.cpu_count() and cl["ram_gb"] > 0
    assert cl["gpu_count"] == 0 and cl["gpu_name"] is None and cl["world_size"] == 1
    assert cl["provider"] == "lambda" and cl["instance_type"] == "gpu_1x_a100_sxm4"
    d = m["dollars"]
    assert d["spent_usd"] == SPENT_AT_EXPORT and d["cap_usd"] == 35.0 and "budget.json" in d["source"]
    state, problem = ck.verify(built.ckpt / "step_0000006")
    assert problem is None
    p = m["progress"]
    assert p["steps"] == STEPS and p["tokens"] == STEPS * 16 * 32 == state["tokens_seen"]
    assert p["restarts"] == RESTARTS and p["restart_steps"] == [3]
    assert p["train_time_s"] == state["train_time_s"] > 0 and p["wall_clock_s"] >= p["train_time_s"]
    val = {x.step: x.value for x in client.get_metric_history(run.info.run_id, "val/loss")}
    train = {x.step: x.value for x in client.get_metric_history(run.info.run_id, "train/loss")}
    assert m["loss"]["final_val"] == val[STEPS] == state["last_val_loss"] and m["loss"]["final_val_step"] == STEPS
    assert m["loss"]["final_train"] == train[STEPS]
    bpb = {x.step: x.value for x in client.get_metric_history(run.info.run_id, "val/bpb")}
    assert set(bpb) == set(val) and m["loss"]["final_val_bpb"] == bpb[STEPS] == state["last_val_bpb"]
    assert 0 < bpb[STEPS] < val[STEPS]  # GPT-2 tokens of English prose hold more than one byte each
    t = m["throughput"]
    assert t["flops_per_token"] == {
        "honest": flops.flops_per_token(cfg.model).honest,
        "lab_6n": flops.flops_per_token(cfg.model).lab_6n,
    }
    assert t["mean_tokens_per_s"] == pytest.approx(p["tokens"] / p["train_time_s"])
    assert t["mfu"] is None and "MFU not reported" in t["mfu_note"] and t["accounting"].startswith("honest")
    fw = m["final_weights"]
    digest = ck.sha256_file(built.ckpt / "final.safetensors")
    assert fw["sha256"] == fw["source_sha256"] == digest == state["files"]["model.safetensors"]
    assert fw["source_checkpoint"] == "step_0000006" and Path(fw["source_path"]) == (built.ckpt / "step_0000006")
    assert (built.bundle / "final.safetensors").read_bytes() == (built.ckpt / "final.safetensors").read_bytes()
    assert m["mlflow"]["run_id"] == run.info.run_id and m["mlflow"]["status"] == "FINISHED"
    assert m["files"]["metrics.csv"] == ck.sha256_file(built.bundle / "metrics.csv")


def test_metrics_csv_has_every_logged_point_once(built, mlflow_run):
    client, run = mlflow_run
    with open(built.bundle / "metrics.csv", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    assert header[:3] == ["step", "name", "value"]
    got: dict[str, dict[int, float]] = {}
    for step, name, value, *_ in rows:
        assert int(step) not in got.setdefault(name, {}), f"{name} twice at step {step}"
        got[name][int(step)] = float(value)
    assert set(got) == set(run.data.metrics)
    for name in run.data.metrics:
        assert got[name] == {x.step: x.value for x in client.get_metric_history(run.info.run_id, name)}, name
    assert set(got["train/loss"]) == {1, 2, 3, 4, 6} and set(got["val/loss"]) == set(got["val/bpb"]) == {0, 3, 6}
    assert got["run/restarts"] == {3: 1.0}
    assert got["budget/spent_usd"][0] == pytest.approx(SPENT_IN_CHECKPOINT, abs=0.01)  # aged by seconds
    steps = [int(r[0]) for r in rows]
    assert steps == sorted(steps)


@pytest.mark.parametrize("name", ["loss-curve.png", "gradnorm-curve.png", "throughput.png"])
def test_figures_are_real_images_of_a_readable_size(built, name):
    import matplotlib.image

    width, height = png_size(built.bundle / name)
    assert 800 <= width <= 2000 and 400 <= height <= 1200
    pixels = matplotlib.image.imread(built.bundle / name)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.05  # drawn on, not blank


def test_run_uri_file_names_the_store_and_run(built, mlflow_run):
    _, run = mlflow_run
    text = (built.bundle / "mlflow-run-uri.txt").read_text()
    assert text.splitlines()[0] == f"runs:/{run.info.run_id}"
    assert f"tracking_uri: {built.uri}" in text and "mlflow ui --backend-store-uri" in text


def export(capsys, *args: str) -> tuple[int, str]:
    code = export_run.main(list(args))
    return code, capsys.readouterr().err


def test_unknown_run_id_names_it_and_writes_nothing(built, tmp_path, capsys):
    code, err = export(capsys, "--mlflow-uri", built.uri, "--output", str(tmp_path / "out"), "--run-id", "deadbeef")
    assert code == EXIT_USAGE and "--run-id deadbeef: no such run" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_store_and_experiment_are_named(built, tmp_path, capsys):
    code, err = export(capsys, "--mlflow-uri", (tmp_path / "nope").as_uri(), "--output", str(tmp_path / "o"))
    assert code == EXIT_USAGE and "is not a directory" in err
    code, err = export(capsys, "--mlflow-uri", built.uri, "--output", str(tmp_path / "o"), "--experiment", "x9")
    assert code == EXIT_USAGE and "'x9': not in" in err and "x1-pretraining" in err
    assert not (tmp_path / "o").exists()


def test_run_without_metrics_or_final_checkpoint_is_refused(tmp_path, capsys):
    from mlflow import MlflowClient

    store = tmp_path / "mlruns"
    client = MlflowClient(tracking_uri=store.as_uri())
    exp = client.create_experiment("x1-pretraining")
    empty = client.create_run(exp).info.run_id
    client.set_terminated(empty)
    code, err = export(capsys, "--mlflow-uri", store.as_uri(), "--output", str(tmp_path / "o"))
    assert code == EXIT_USAGE and f"run {empty}" in err and "has no metrics" in err
    no_final = client.create_run(exp).info.run_id
    client.log_metric(no_final, "train/loss", 10.0, step=1)
    client.set_terminated(no_final, status="KILLED")
    code, err = export(capsys, "--mlflow-uri", store.as_uri(), "--output", str(tmp_path / "o"), "--run-id", no_final)
    assert code == EXIT_USAGE and "no final checkpoint" in err and "status KILLED" in err
    assert not (tmp_path / "o").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["mlruns"]


def test_missing_or_foreign_final_checkpoint_is_named(built, tmp_path, capsys):
    moved = tmp_path / "moved"
    moved.mkdir()
    out = tmp_path / "o"
    code, err = export(capsys, "--mlflow-uri", built.uri, "--output", str(out), "--ckpt-dir", str(moved))
    assert code == EXIT_USAGE and f"final checkpoint missing: {moved / 'final.safetensors'}" in err
    shutil.copy(built.ckpt / "final.safetensors", moved)
    code, err = export(capsys, "--mlflow-uri", built.uri, "--output", str(out), "--ckpt-dir", str(moved))
    assert code == EXIT_USAGE and "step_0000006" in err and "does not exist" in err
    shutil.copytree(built.ckpt / "step_0000006", moved / "step_0000006")
    shutil.copy(built.ckpt / "step_0000003" / "model.safetensors", moved / "final.safetensors")
    code, err = export(capsys, "--mlflow-uri", built.uri, "--output", str(out), "--ckpt-dir", str(moved))
    assert code == EXIT_USAGE and "is not a copy of" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["moved"]


def test_moved_checkpoints_and_reexport_keep_the_users_files(built, tmp_path, capsys):
    moved = tmp_path / "ckpt"
    moved.mkdir()
    shutil.copy(built.ckpt / "final.safetensors", moved)
    shutil.copytree(built.ckpt / "step_0000006", moved / "step_0000006")
    out = tmp_path / "bundle"
    shutil.copytree(built.bundle, out)
    (out / "spike-postmortem.md").write_text("# Spike at step 12000\n")
    code, err = export(capsys, "--mlflow-uri", built.uri, "--output", str(out), "--ckpt-dir", str(moved))
    assert code == EXIT_USAGE and "--overwrite" in err
    code, err = export(
        capsys,
        "--mlflow-uri",
        built.uri,
        "--output",
        str(out),
        "--ckpt-dir",
        str(moved),
        "--overwrite",
        "--spent-usd",
        "0",
        "--provider",
        "local",
    )
    assert code == 0, err
    m = read_manifest(out)
    assert m["dollars"]["spent_usd"] == 0 and "--spent-usd" in m["dollars"]["source"]
    assert m["cluster"]["provider"] == "local" and Path(m["final_weights"]["source_path"]) == moved / "step_0000006"
    assert (out / "spike-postmortem.md").read_text() == "# Spike at step 12000\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "ckpt"]


def test_a_failure_while_writing_leaves_no_bundle(tmp_path):
    out = tmp_path / "run-cloud"

    def fill(tmp: Path) -> None:
        (tmp / "manifest.json").write_text("{}")
        raise X1Error("disk full")

    with pytest.raises(X1Error, match="disk full"):
        bundle.write_bundle(out, fill, overwrite=False)
    assert list(tmp_path.iterdir()) == []


def final_of(ckpt_dir: Path, step: str = "step_0000006") -> manifest.FinalCheckpoint:
    state, problem = ck.verify(ckpt_dir / step)
    assert problem is None
    return manifest.FinalCheckpoint(ckpt_dir / ck.FINAL_MODEL, ckpt_dir / step, state, "")


def test_budget_falls_back_to_the_checkpoint_snapshot(built, tmp_path, capsys):
    run = runs.load_run(built.uri)
    alone = tmp_path / "ckpt"  # the step dir without the guard's ledger beside it
    shutil.copytree(built.ckpt / "step_0000006", alone / "step_0000006")
    run.tags["budget_curr_cost_uri"] = str(built.root / "gone.json")
    dollars, _ = manifest._dollars(run, final_of(alone), None, None)
    assert dollars["spent_usd"] == pytest.approx(SPENT_IN_CHECKPOINT, abs=0.01)
    assert "trainer_state.json" in dollars["source"]
    assert "gone.json does not exist" in capsys.readouterr().err  # a warning: on stderr
    with pytest.raises(X1Error, match="--budget-curr-cost-uri"):
        manifest._dollars(run, final_of(alone), None, str(built.root / "gone.json"))


def test_dollars_come_from_the_ledger_and_a_budget_json_older_than_the_run_is_not_used_silently(
    built, tmp_path, capsys
):
    run = runs.load_run(built.uri)
    ledger = json.loads((built.ckpt / "budget_ledger.json").read_text())["memory"]
    old = tmp_path / "budget.json"  # a sidecar that died an hour before the run ended, with a higher bill
    old.write_text(
        json.dumps(
            {
                "spent_usd": 99.0,
                "rate_usd_per_hr": 1.1,
                "hours_elapsed": 9,
                "projected_total_usd": 99,
                "last_update_utc": "2020-01-01T00:00:00Z",
            }
        )
    )
    run.tags["budget_curr_cost_uri"] = str(old)
    dollars, _ = manifest._dollars(run, final_of(built.ckpt), None, None)
    assert dollars["spent_usd"] == ledger["spent_usd"] and dollars["counted_at_utc"] == ledger["spent_at_utc"]
    assert "budget_ledger.json (the budget guard's count at" in dollars["source"]
    warned = capsys.readouterr().err
    assert "was last updated 2020-01-01T00:00:00Z, before the run ended" in warned
    assert any("before the run ended" in n for n in dollars["notes"]) and any("stale" in n for n in dollars["notes"])
    # the sidecar's fresh final reading, above the ledger, is the better figure (the bundle's own manifest)
    m = read_manifest(built.bundle)["dollars"]
    assert m["spent_usd"] == SPENT_AT_EXPORT > ledger["spent_usd"] and "at or above the guard's ledger" in m["source"]


def test_dedupe_keeps_the_replayed_point():
    pts = [
        runs.MetricPoint("train/loss", 5, 2.0, 100),
        runs.MetricPoint("train/loss", 5, 2.5, 200),
        runs.MetricPoint("val/loss", 4, 3.0, 150),
    ]
    kept, dropped = runs.dedupe(pts)
    assert dropped == 1 and [(p.name, p.step, p.value) for p in kept] == [("val/loss", 4, 3.0), ("train/loss", 5, 2.5)]


def test_a_symlink_beside_the_bundle_is_kept_as_a_link_never_followed(tmp_path):
    """A re-export keeps the user's files in the bundle folder; a link there (to a file or a folder outside it)
    stays a link: the outside file's bytes never enter the bundle that goes to the bucket."""
    secret = tmp_path / "outside" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("PRIVATE-KEY-4242\n")
    out = tmp_path / "run-cloud"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "notes.md").write_text("mine\n")
    os.symlink(secret, out / "key.txt")
    os.symlink(secret.parent, out / "linked-dir")
    (out / "sub").mkdir()
    os.symlink(secret, out / "sub" / "inner-link")

    def fill(tmp: Path) -> None:
        (tmp / "manifest.json").write_text("{}")

    bundle.write_bundle(out, fill, overwrite=True)
    assert (out / "notes.md").read_text() == "mine\n"
    for link in (out / "key.txt", out / "linked-dir", out / "sub" / "inner-link"):
        assert link.is_symlink(), link
    copied = [
        Path(root) / n for root, _, names in os.walk(out) for n in names if not (Path(root) / n).is_symlink()
    ]  # os.walk does not follow links
    assert sorted(p.name for p in copied) == ["manifest.json", "notes.md"]
    assert all("PRIVATE-KEY" not in p.read_text() for p in copied)
