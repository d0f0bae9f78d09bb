from __future__ import annotations

import re

from x1_pretrain import postmortem as postmortem_cli

from ..procs import run_info
from ..run_bundle import build


def uri(ckpt) -> str:
    return f"sqlite:///{ckpt.resolve()}/mlflow.db"


def test_postmortem_of_an_injected_spike_names_the_steps_and_numbers(short_spiked_run, tmp_path, capsys):
    out = tmp_path / "bundle" / "spike-postmortem.md"
    assert postmortem_cli.main(["--mlflow-uri", uri(short_spiked_run), "--output", str(out)]) == 0
    text = out.read_text()
    assert "Spike: **injected**, steps 12–16 (5 steps)" in text
    assert "--inject-spike-at-step 12 --spike-batches 5" in text
    client, runs = run_info(short_spiked_run)
    loss = {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, "train/loss")}
    peak_step = max(range(12, 17), key=lambda s: loss[s])
    assert f"| peak loss | {loss[peak_step]:.4f} at step {peak_step}" in text
    assert "active on 5 of 5 spike steps: it caught the spike" in text
    m = re.search(r"recovery \(loss back within ([\d.]+) nats of the baseline\) \| step (\d+)", text)
    assert m is not None and int(m.group(2)) > 16
    rows = re.findall(r"^\| (\d+) \| [\d.]+ \|.*\| injected \|$", text, flags=re.M)
    assert [int(r) for r in rows] == [12, 13, 14, 15, 16]
    assert text.count("TO BE WRITTEN BY YOU") == 2
    png = out.with_name("spike.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(png[16:20], "big") >= 600
    assert not list(out.parent.glob(".*tmp*"))


def test_no_spike_exits_non_zero_naming_the_thresholds(tmp_path_factory, demo_data, tmp_path, capsys):
    """The session's bundle run (run_bundle: no injection, nothing flagged) has no spike."""
    built = build(tmp_path_factory, demo_data)
    out = tmp_path / "pm.md"
    assert postmortem_cli.main(["--mlflow-uri", built.uri, "--output", str(out)]) == 1
    err = capsys.readouterr().err
    assert "no spike found" in err and "loss_sigma 6" in err and "grad_factor 5" in err
    assert not out.exists()


def test_unknown_run_and_store_are_usage_errors(tmp_path_factory, demo_data, tmp_path, capsys):
    built = build(tmp_path_factory, demo_data)
    args = ["--mlflow-uri", built.uri, "--run-id", "nope", "--output", str(tmp_path / "x")]
    assert postmortem_cli.main(args) == 2
    assert "--run-id nope" in capsys.readouterr().err
    assert postmortem_cli.main(["--mlflow-uri", (tmp_path / "none").as_uri()]) == 2
