from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from x1_pretrain import dod as dod_cli
from x1_pretrain.core import safetensors_io
from x1_pretrain.core.contract import EXIT_USAGE
from x1_pretrain.report import dod

from ..run_bundle import SPENT_AT_EXPORT, BuiltRun, build

pytestmark = pytest.mark.xdist_group("bundle")  # shares a session-built run with other modules

PASSING = ["--val-band", "0", "20"]  # a CPU run's loss is ~10: widen the band to see every other check pass


@pytest.fixture(scope="session")
def built(tmp_path_factory, demo_data) -> BuiltRun:
    return build(tmp_path_factory, demo_data)


@pytest.fixture
def run_dir(built, tmp_path) -> Path:
    """The exported bundle plus what people add by hand: the post-mortem and the termination screenshot."""
    d = tmp_path / "run-cloud"
    shutil.copytree(built.bundle, d)
    (d / dod.POSTMORTEM).write_text("# Loss spike at step 12000\n\nInjected; grad clip held it.\n")
    shutil.copy(d / "throughput.png", d / "termination-lambda-dashboard.png")
    return d


def check(capsys, run_dir: Path, *extra: str) -> tuple[int, dict[int, dict]]:
    code = dod_cli.main(["--run-dir", str(run_dir), "--json", *extra])
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] == (code == 0)
    return code, {c["id"]: c for c in out["checks"]}


def failing(checks: dict[int, dict]) -> set[int]:
    return {i for i, c in checks.items() if not c["passed"]}


def edit_manifest(run_dir: Path, edit) -> None:
    path = run_dir / "manifest.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def test_a_complete_bundle_passes_every_check(run_dir, capsys):
    code = dod_cli.main(["--run-dir", str(run_dir), *PASSING])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("PASS") == 6 and "6/6 checks pass" in out and "FAIL" not in out
    assert "seed 42" in out and f"${SPENT_AT_EXPORT:.2f} spent" in out and "tensor-for-tensor equal" in out
    assert "termination-lambda-dashboard.png" in out and "Loss spike at step 12000" in out


def test_lab_band_fails_a_cpu_run_and_says_why(run_dir, capsys):
    code, checks = check(capsys, run_dir)
    assert code == dod.EXIT_FAILED and failing(checks) == {2}
    assert "above the band" in checks[2]["evidence"] and checks[2]["check"] == "final val loss in [3.20, 3.50]"


def test_missing_manifest_fails_the_checks_that_need_it(run_dir, capsys):
    (run_dir / "manifest.json").unlink()
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == 1 and failing(checks) == {1, 2, 3, 4}
    assert "manifest.json not found" in checks[1]["evidence"] and "export_run" in checks[1]["evidence"]
    assert "does not say which checkpoint" in checks[3]["evidence"]


@pytest.mark.parametrize(
    ("edit", "names"),
    [
        (lambda m: m.pop("seed"), "seed"),
        (lambda m: m["versions"].pop("torch"), "versions"),
        (lambda m: m.update(cluster={}), "cluster"),
        (lambda m: m["dollars"].update(spent_usd=None, source="the run had no budget guard"), "dollars.spent_usd"),
    ],
)
def test_manifest_without_a_lab_field_fails_naming_it(run_dir, capsys, edit, names):
    edit_manifest(run_dir, edit)
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == 1 and 1 in failing(checks) and names in checks[1]["evidence"]


def test_spend_over_the_cap_fails(run_dir, capsys):
    code, checks = check(capsys, run_dir, *PASSING, "--budget-cap-usd", "10")
    assert code == dod.EXIT_FAILED and failing(checks) == {4}
    assert f"${SPENT_AT_EXPORT:.2f} > $10.00" in checks[4]["evidence"]
    edit_manifest(run_dir, lambda m: m["dollars"].update(spent_usd=None, source="the run had no budget guard"))
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and 4 in failing(checks) and "no budget guard" in checks[4]["evidence"]


def test_damaged_weights_fail_the_round_trip(run_dir, capsys):
    path = run_dir / "final.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {3} and "does not load" in checks[3]["evidence"]
    (run_dir / "final.safetensors").unlink()
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {3} and "final.safetensors not found" in checks[3]["evidence"]


def test_weights_that_resave_differently_fail(run_dir, capsys):
    # Same tensors, header laid out by another writer: loads fine, but is not byte-stable.
    path = run_dir / "final.safetensors"
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.dumps(json.loads(raw[8 : 8 + n]), indent=2).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + n :])
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {3} and "gives other bytes" in checks[3]["evidence"]


def test_weights_from_another_checkpoint_fail(run_dir, built, capsys):
    tensors = safetensors_io.load(built.ckpt / "step_0000003" / "model.safetensors")
    safetensors_io.save(tensors, run_dir / "final.safetensors", {"format": "pt"})
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {3}
    assert "is not step_0000006's model.safetensors" in checks[3]["evidence"]


def test_source_checkpoint_elsewhere_is_matched_by_its_recorded_hash(run_dir, capsys):
    edit_manifest(run_dir, lambda m: m["final_weights"].update(source_path="/elsewhere/step_0000006"))
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == 0 and "not on this machine" in checks[3]["evidence"]


def test_postmortem_must_exist_and_say_something(run_dir, capsys):
    (run_dir / dod.POSTMORTEM).write_text("  \n\n")
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {5} and "is empty" in checks[5]["evidence"]
    (run_dir / dod.POSTMORTEM).unlink()
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {5} and "not found" in checks[5]["evidence"]


def test_termination_proof_must_be_a_real_image(run_dir, capsys):
    (run_dir / "termination-lambda-dashboard.png").write_text("I promise I terminated it")
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {6} and "is not a PNG file" in checks[6]["evidence"]
    (run_dir / "termination-lambda-dashboard.png").unlink()
    code, checks = check(capsys, run_dir, *PASSING)
    assert code == dod.EXIT_FAILED and failing(checks) == {6} and "no termination*.png" in checks[6]["evidence"]
    (run_dir / "dashboard.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 100)
    code, checks = check(capsys, run_dir, *PASSING, "--termination-proof", "dashboard.jpg")
    assert code == 0 and "dashboard.jpg" in checks[6]["evidence"]
    code, checks = check(capsys, run_dir, *PASSING, "--termination-proof", "missing.png")
    assert code == dod.EXIT_FAILED and failing(checks) == {6} and "missing.png not found" in checks[6]["evidence"]


def test_usage_mistakes_exit_2(tmp_path, capsys):
    assert dod_cli.main(["--run-dir", str(tmp_path / "none")]) == EXIT_USAGE
    assert "is not a directory" in capsys.readouterr().err
    assert dod_cli.main(["--run-dir", str(tmp_path), "--val-band", "3.5", "3.2"]) == EXIT_USAGE
    assert "LOW must not exceed HIGH" in capsys.readouterr().err


def test_notes_give_the_task_scores_and_what_the_band_means_for_the_tokens_trained():
    from x1_pretrain.report.dod import notes

    m = {
        "evals": {
            "tasks": {
                "hellaswag": {"acc": 0.2931, "acc_norm": 0.3104, "n": 10042, "step": 33766},
                "winogrande": {"acc": 0.51, "acc_norm": None, "n": 1267, "step": 33766},
            }
        },
        "progress": {"tokens": 33766 * 524288},
        "parameters": {"non_embedding": 50_331_648},
    }
    scores, band = notes(m, (3.20, 3.50))
    assert "hellaswag acc 0.2931, acc_norm 0.3104 (n=10042, step 33766)" in scores
    assert "winogrande acc 0.5100 (n=1267, step 33766)" in scores and "not a check" in scores
    # 17.70B tokens: the fit predicts 3.20 (ERRATA 5: 3.10 at the lab's 44B tokens)
    assert "this run trained 17.70B tokens, for which plan predicts 3.22" in band and "inside the band" in band
    assert "(44.0B tokens; plan predicts 3.10 there)" in band
    assert notes({"progress": {"tokens": 1e6}, "parameters": {"non_embedding": 1e5}}, (3.2, 3.5))[0].endswith(
        "not a fault of the run"
    )
    assert notes(None, (3.2, 3.5)) == []
