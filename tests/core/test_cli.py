"""A renamed flag keeps its old spelling for one release: same value, one notice, hidden from --help."""

from __future__ import annotations

import argparse

import pytest

from x1_pretrain import budget_sidecar, export_run, plan
from x1_pretrain.core.cli import old_spelling
from x1_pretrain.launch import options


def test_an_old_spelling_sets_the_new_destination_with_one_notice(capsys):
    p = argparse.ArgumentParser()
    old_spelling(p, "--old-rate", p.add_argument("--new-rate", type=float))
    old_spelling(p, "--old-flag", p.add_argument("--new-flag", action="store_true", default=None))
    args = p.parse_args(["--old-rate", "1.5", "--old-flag"])
    assert (args.new_rate, args.new_flag) == (1.5, True)
    err = capsys.readouterr().err
    assert "deprecated: --old-rate is now --new-rate" in err and "deprecated: --old-flag is now --new-flag" in err
    assert p.parse_args(["--new-rate", "2"]).new_rate == 2.0 and capsys.readouterr().err == ""
    assert "--old-rate" not in p.format_help() and "--new-rate" in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--old-rate", "fast"])  # the same type check as the new spelling


TRAIN = ["--config", "c.yaml", "--data-dir", "d"]
TRAIN_PAIRS = [
    (["--fit-to-budget"], ["--budget-fit"]),
    (["--max-hours", "3"], ["--budget-max-hours", "3"]),
    (["--assumed-mfu", "0.3"], ["--budget-assumed-mfu", "0.3"]),
    (["--expected-step-s", "2"], ["--budget-expected-step-s", "2"]),
    (["--max-rate-usd-per-hr", "2"], ["--budget-max-rate-usd-per-hr", "2"]),
    (["--ckpt-every-min", "15"], ["--checkpoint-every-min", "15"]),
    (["--min-tokens-per-s-window", "30"], ["--min-tokens-per-s-window-min", "30"]),
    (["--skip-spike-steps"], ["--spike-skip-steps"]),
]


@pytest.mark.parametrize(("old", "new"), TRAIN_PAIRS)
def test_the_trainers_old_spellings_set_the_same_config_key(old, new, capsys):
    parse = options.build_parser().parse_args
    assert (
        options.options_from(parse([*TRAIN, *old])).overrides
        == options.options_from(parse([*TRAIN, *new])).overrides
        != {}
    )
    assert f"deprecated: {old[0]} is now {new[0]}" in capsys.readouterr().err


def test_the_labs_ckpt_every_is_kept_without_a_notice(capsys):
    args = options.build_parser().parse_args([*TRAIN, "--ckpt-every", "1800"])
    assert options.options_from(args).overrides == {"checkpoint.every_steps": 1800}
    assert capsys.readouterr().err == ""


def test_every_budget_key_has_a_trainer_flag_and_plan_uses_the_same_names():
    help_text = options.build_parser().format_help()
    for key in options.BUDGET_HELP:
        assert options.budget_flag(key) in help_text
    plan_help = plan.build_parser().format_help()
    for flag in (
        "--budget-cap-usd",
        "--budget-assumed-mfu",
        "--budget-buffer-usd",
        "--budget-reserve-min",
        "--budget-max-hours",
        "--budget-fit",
    ):
        assert flag in plan_help
    args = plan.build_parser().parse_args(
        ["--config", "c", "--rate-usd-per-hr", "1", "--mfu", "0.3", "--buffer-usd", "2", "--reserve-min", "5"]
    )
    assert (args.budget_assumed_mfu, args.budget_buffer_usd, args.budget_reserve_min) == (0.3, 2.0, 5.0)


def test_the_sidecar_and_export_run_take_the_names_of_the_flags_they_pair_with():
    side = budget_sidecar.build_parser()
    assert side.parse_args(["--provider", "clock", "--base-url", "http://x"]).provider_base_url == "http://x"
    assert "--budget-curr-cost-uri" in side.format_help() and "--budget-sidecar-interval-min" in side.format_help()
    exp = export_run.build_parser()
    a = exp.parse_args(["--mlflow-uri", "m", "--output", "o", "--budget-json", "b.json"])
    b = exp.parse_args(["--mlflow-uri", "m", "--output", "o", "--budget-curr-cost-uri", "b.json"])
    assert a.curr_cost_uri == b.curr_cost_uri == "b.json"
