"""The trainer's flags become config keys; the watchdog reads the cap a train command will run with."""

from __future__ import annotations

from pathlib import Path

from x1_pretrain import watchdog
from x1_pretrain.launch.options import budget_of_command, build_parser, options_from

from ..conftest import REPO

LAB = str(REPO / "configs" / "x1-50m-a100.yaml")
TINY = str(REPO / "configs" / "x1-tiny-cpu.yaml")


def test_budget_flags_are_overrides_of_the_config_keys():
    args = build_parser().parse_args(
        [
            "--config",
            LAB,
            "--data-dir",
            "d",
            "--budget-cap-usd",
            "20",
            "--budget-stop-wait-s",
            "30",
            "--budget-curr-cost-uri",
            "b.json",
            "--force-launch",
        ]
    )
    opts = options_from(args)
    assert opts.overrides == {"budget.cap_usd": 20.0, "budget.stop_wait_s": 30.0}
    assert (opts.curr_cost_uri, opts.force_launch, opts.dry_run_budget) == ("b.json", True, False)
    bare = options_from(build_parser().parse_args(["--config", LAB, "--data-dir", "d"]))
    assert bare.overrides == {}  # nothing given: the config's values (and their defaults) stand


def test_the_watchdog_takes_the_cap_from_the_train_commands_config(tmp_path):
    cfg = tmp_path / "capped.yaml"
    cfg.write_text(Path(TINY).read_text() + "\nbudget:\n  cap_usd: 12.5\n  alert_usd: 10\n")
    python = ["python", "-m", "x1_pretrain.train", "--config", str(cfg), "--data-dir", "d"]
    assert budget_of_command([*python, "--budget-curr-cost-uri", "b.json"]) == (12.5, "b.json")
    assert budget_of_command([*python, "--budget-cap-usd", "11"]) == (11.0, None)
    assert budget_of_command([*python, "--set", "budget.cap_usd=19"]) == (19.0, None)
    torchrun = ["torchrun", "--nproc_per_node=2", "-m", "x1_pretrain.train", "--config", str(cfg), "--data-dir", "d"]
    assert budget_of_command(torchrun) == (12.5, None)
    assert budget_of_command(["python", "-m", "x1_pretrain.train", "--config", TINY, "--data-dir", "d"]) == (None, None)
    assert budget_of_command(["python", "other.py", "--budget-cap-usd", "3"]) == (None, None)

    args = watchdog.build_parser().parse_args([])
    line = watchdog.options(args, [*python, "--budget-curr-cost-uri", "b.json"]).budget_line
    assert line is not None and (line.cap_usd, line.curr_cost_uri) == (12.5, "b.json")
    assert watchdog.options(args, python).budget_line is None  # a cap but no source: the trainer refuses it
    other = watchdog.options(args, ["./my_trainer", "--budget-cap-usd", "3", "--budget-curr-cost-uri", "b"])
    assert other.budget_line is not None and other.budget_line.cap_usd == 3.0
