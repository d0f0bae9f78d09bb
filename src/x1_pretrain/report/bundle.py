"""The run bundle: MLflow run + final checkpoint → manifest, metrics.csv, figures, final.safetensors and
the run URI, built in a temporary dir and renamed into place (``export_run.py`` is the command)."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..core import names as N
from ..core import redact
from ..core.errors import X1Error
from ..core.fileio import fsync_dir, fsync_tree, replace_dir, sha256_file
from . import manifest as mf
from . import plots, runs

BUNDLE_FILES = (
    "manifest.json",
    "metrics.csv",
    "loss-curve.png",
    "gradnorm-curve.png",
    "throughput.png",
    mf.BUNDLE_MODEL,
    "mlflow-run-uri.txt",
)
LAB_VAL_BAND = (3.20, 3.50)


def write_metrics_csv(points: list[runs.MetricPoint], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "name", "value", "timestamp_ms"])
        for p in points:
            w.writerow([p.step, p.name, repr(p.value), p.timestamp_ms])


def _of(points: list[runs.MetricPoint], name: str) -> list[runs.MetricPoint]:
    return [p for p in points if p.name == name]


def draw(points: list[runs.MetricPoint], run: runs.RunRecord, manifest: dict[str, Any], out: Path) -> None:
    name = run.run_name or run.run_id[:8]
    val = _of(points, N.VAL_LOSS)
    band = LAB_VAL_BAND if val and val[-1].value < LAB_VAL_BAND[1] + 1.0 else None
    plots.loss_curve(_of(points, N.TRAIN_LOSS), val, out / "loss-curve.png", f"{name}: train and val loss", band)
    clip = (manifest["config"].get("optim") or {}).get("grad_clip")
    plots.gradnorm_curve(
        _of(points, N.TRAIN_GRAD_NORM),
        _of(points, N.TRAIN_PARAM_NORM),
        out / "gradnorm-curve.png",
        f"{name}: gradient and parameter norms",
        clip,
    )
    tps = manifest["throughput"]["mean_tokens_per_s"]
    start = run.start_ms or min(p.timestamp_ms for p in points)
    plots.throughput(
        _of(points, N.TRAIN_TOKENS_PER_S),
        _of(points, N.RUN_RESTARTS),
        start,
        out / "throughput.png",
        f"{name}: throughput" + (f" (mean {tps:,.0f} tokens/s)" if tps else ""),
    )


def write_bundle(out: Path, fill: Any, overwrite: bool) -> None:
    """Call ``fill(tmp_dir)``, then put the result at ``out`` with two renames; keeps foreign files of ``out``."""
    out = out.resolve()
    if out.exists() and not out.is_dir():
        raise X1Error(f"--output {out} is a file; give a directory")
    if (out / "manifest.json").exists() and not overwrite:
        raise X1Error(
            f"--output {out} already holds an exported run (manifest.json); pass --overwrite to replace "
            "it (other files there, like spike-postmortem.md, are kept) or choose another directory"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        if out.exists():
            for item in out.iterdir():  # a symlink is kept as a link, never followed: no outside file comes in
                if item.name in BUNDLE_FILES:
                    continue
                if item.is_dir() and not item.is_symlink():
                    shutil.copytree(item, tmp / item.name, symlinks=True)
                else:
                    shutil.copy2(item, tmp / item.name, follow_symlinks=False)
        fsync_tree(tmp)
        replace_dir(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export(args: argparse.Namespace) -> Path:
    run = runs.load_run(args.mlflow_uri, args.run_id, args.experiment)
    if not run.metrics:
        raise X1Error(
            f"run {run.run_id} in {redact.url(run.uri)} has no metrics (nothing was logged: did training "
            "start?); export needs at least train/loss"
        )
    points, replayed = runs.dedupe(run.metrics)
    final = mf.locate_final(run, args.ckpt_dir)
    manifest = mf.build(
        run, final, points, replayed, mf.Facts(args.spent_usd, args.curr_cost_uri, args.provider, args.instance_type)
    )

    def fill(tmp: Path) -> None:
        shutil.copyfile(final.weights, tmp / mf.BUNDLE_MODEL)
        if sha256_file(tmp / mf.BUNDLE_MODEL) != final.sha256:
            raise X1Error(f"{final.weights} changed while it was being copied; run the export again")
        write_metrics_csv(points, tmp / "metrics.csv")
        draw(points, run, manifest, tmp)
        (tmp / "mlflow-run-uri.txt").write_text(run_uri_text(run))
        manifest["files"] = {f.name: sha256_file(f) for f in sorted(tmp.iterdir()) if f.name != mf.BUNDLE_MODEL}
        manifest["files"][mf.BUNDLE_MODEL] = final.sha256
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")

    write_bundle(args.output, fill, args.overwrite)
    return args.output.resolve()


def run_uri_text(run: runs.RunRecord) -> str:
    """``mlflow-run-uri.txt``: the store with its secrets masked (the reader brings MLFLOW_TRACKING_USERNAME /
    MLFLOW_TRACKING_PASSWORD, never a password in the bundle)."""
    uri = redact.url(run.uri) or run.uri
    if uri.startswith(("http://", "https://")):
        ui = f"{uri.rstrip('/')}/#/experiments/{run.experiment_id}/runs/{run.run_id}"
    else:
        env = "MLFLOW_ALLOW_FILE_STORE=true " if uri.startswith("file:") else ""
        ui = f"{env}mlflow ui --backend-store-uri {uri}  (then experiment {run.experiment_name}, run {run.run_id})"
    return (
        f"runs:/{run.run_id}\ntracking_uri: {uri}\nexperiment: {run.experiment_name} "
        f"(id {run.experiment_id})\nrun_id: {run.run_id}\nrun_name: {run.run_name}\nui: {ui}\n"
    )


def summary(out: Path) -> str:
    m = json.loads((out / "manifest.json").read_text())
    d, p, lo, t = m["dollars"], m["progress"], m["loss"], m["throughput"]
    spent = f"${d['spent_usd']:.2f}" if d["spent_usd"] is not None else "unknown"
    mfu = f"MFU {t['mfu']:.3f} (lab 6N: {t['mfu_lab_6n']:.3f})" if t["mfu"] is not None else "MFU n/a"
    val = f"{lo['final_val']:.4f}" if lo["final_val"] is not None else "n/a"
    tps = f"{t['mean_tokens_per_s']:,.0f}" if t["mean_tokens_per_s"] else "n/a"
    return (
        f"exported run {m['mlflow']['run_id']} to {out}\n"
        f"  {p['steps']:,} steps, {p['tokens']:,} tokens, {p['restarts']} restart(s); final val loss {val}; "
        f"{tps} tokens/s, {mfu}; spent {spent}\n"
        f"  files: {', '.join(BUNDLE_FILES)}"
    )
