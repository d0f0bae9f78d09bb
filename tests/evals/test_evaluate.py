"""``python -m x1_pretrain.evaluate`` end to end on a real checkpoint dir and local sets: the table, the JSON,
and the usage mistakes (exit 2, the name and the fix, nothing written)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from x1_pretrain import evaluate
from x1_pretrain.evals import registry

from ..ckpt_utils import TINY_GPT2, random_model, write_checkpoint
from .test_sets import arrow_bytes

PIQA = [{"goal": f"Goal {i}", "sol1": "do this", "sol2": "do that instead", "label": i % 2} for i in range(10)]
WINO = [
    {"sentence": f"Ann met Bo and _ smiled {i}.", "option1": "Ann", "option2": "Bo", "answer": "1"} for i in range(6)
]


@pytest.fixture()
def local_sets(tmp_path, monkeypatch):
    blobs = {"piqa": arrow_bytes(PIQA), "winogrande": arrow_bytes(WINO)}
    data = tmp_path / "evaldata"
    data.mkdir()
    for name, blob in blobs.items():
        (data / f"{name}.arrow").write_bytes(blob)
    for k, blob in blobs.items():
        monkeypatch.setitem(registry.TASKS, k, replace(registry.TASKS[k], sha256=hashlib.sha256(blob).hexdigest()))
    return data


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-ckpt")
    write_checkpoint(root / "ckpt", random_model(TINY_GPT2), step=11)
    return root / "ckpt"


def test_scores_a_checkpoint_dir_prints_the_table_and_writes_the_json(ckpt, local_sets, tmp_path, capsys):
    out = tmp_path / "results.json"
    code = evaluate.main(
        [
            "--checkpoint",
            str(ckpt),
            "--tasks",
            "piqa,winogrande",
            "--eval-data-dir",
            str(local_sets),
            "--limit",
            "8",
            "--batch-size",
            "3",
            "--output",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    lines = printed.strip().splitlines()
    assert lines[0].split() == ["task", "split", "n", "acc", "acc_norm", "chance"]
    assert lines[1].split()[:3] == ["piqa", "validation", "8"] and lines[1].split()[5] == "0.5000"
    assert lines[2].split()[:3] == ["winogrande", "validation", "6"] and lines[2].split()[4] == "—"
    result = json.loads(out.read_text())
    assert result["step"] == 11 and result["limit"] == 8 and set(result["tasks"]) == {"piqa", "winogrande"}
    piqa = result["tasks"]["piqa"]
    assert piqa["n"] == 8 and 0 <= piqa["acc"] <= 1 and piqa["chance"] == 0.5
    assert piqa["split"] == "validation" and piqa["limit"] == 8
    wino = result["tasks"]["winogrande"]
    assert wino["acc_norm"] is None and wino["n"] == 6 and wino["limit"] == 8  # n: scored, never the limit asked
    assert result["data_sha256"]["piqa"] == registry.TASKS["piqa"].sha256


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tasks", "piqa,mmlu"], "unknown task 'mmlu'; choose among"),
        (["--tasks", "piqa", "--limit", "0"], "--limit 0: must be at least 1"),
        (["--tasks", "piqa"], None),
    ],
)
def test_usage_mistakes_exit_2_with_the_fix(ckpt, local_sets, tmp_path, capsys, args, message):
    target = ckpt if message else tmp_path / "not-a-checkpoint"
    out = tmp_path / "r.json"
    code = evaluate.main(["--checkpoint", str(target), "--eval-data-dir", str(local_sets), "--output", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not out.exists()
    assert (message or "not-a-checkpoint") in err


def test_a_damaged_local_file_is_refused(ckpt, local_sets, tmp_path, capsys):
    (local_sets / "piqa.arrow").write_bytes(b"not arrow")
    assert evaluate.main(["--checkpoint", str(ckpt), "--tasks", "piqa", "--eval-data-dir", str(local_sets)]) == 2
    assert "piqa.arrow: sha256" in capsys.readouterr().err
