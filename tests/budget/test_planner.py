"""``plan`` must reproduce the arithmetic in docs/errata.md and say plainly what fits."""

from __future__ import annotations

import pytest

from x1_pretrain import plan as plan_cli
from x1_pretrain.budget import planner as plan
from x1_pretrain.core import config as C
from x1_pretrain.core.contract import EXIT_USAGE
from x1_pretrain.core.errors import X1Error
from x1_pretrain.model import flops

from ..conftest import REPO

LAB = REPO / "configs" / "x1-50m-a100.yaml"


@pytest.fixture(scope="module")
def cfg() -> C.Config:
    return C.load(LAB)


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = plan_cli.main(["--config", str(LAB), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_errata_1_throughput_in_the_honest_accounting(cfg):
    p = plan.make_plan(cfg, "a100-80gb", 1.10, plan.Ask(hours=24, mfu=0.48))  # the lab's (and ERRATA's) MFU
    assert p.fpt.honest == pytest.approx(6.09e8, rel=1e-3) and p.fpt.lab_6n == pytest.approx(3.02e8, rel=1e-3)
    assert p.tokens_per_s == pytest.approx(246_000, rel=0.005)
    assert p.tokens == pytest.approx(21e9, rel=0.02) and p.steps == pytest.approx(40_000, rel=0.02)
    assert p.tokens_per_step == 524_288 and p.mfu(p.fpt.honest) == pytest.approx(0.48)
    for gpu in ("h100", "h200"):
        assert plan.make_plan(cfg, gpu, 3.0, plan.Ask(mfu=0.48)).tokens_per_s == pytest.approx(779_000, rel=0.005)


def test_errata_2_the_labs_84000_steps_do_not_fit(cfg):
    p = plan.make_plan(cfg, "a100-80gb", 1.10, plan.Ask(steps=84_000, mfu=0.48))
    assert 49.0 <= p.hours < 50.0 and 54.0 <= p.compute_usd() < 55.0
    reserve = 1.10 * 10 / 60  # the final checkpoint, export and shutdown
    assert p.total_usd() == pytest.approx(p.compute_usd() + reserve + 1 + 2 + 5)
    assert not p.fits_time and not p.fits_cap
    fits = plan.make_plan(cfg, "a100-80gb", 1.10, plan.Ask(hours=24, mfu=0.48))
    assert fits.fits_time and fits.fits_cap and fits.total_usd() == pytest.approx(24 * 1.10 + reserve + 8, abs=0.01)


def test_errata_5_chinchilla_prediction():
    assert plan.chinchilla_loss(50_331_648, 43e9) == pytest.approx(3.10, abs=0.005)
    assert plan.chinchilla_loss(88_929_024, 43e9) == pytest.approx(2.93, abs=0.005)
    assert plan.CHINCHILLA == {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def test_lab_plan_output_says_it_does_not_fit_and_what_does(capsys):
    code, out, _ = run(
        capsys,
        "--gpu",
        "a100-80gb",
        "--rate-usd-per-hr",
        "1.10",
        "--total-steps",
        "84000",
        "--budget-assumed-mfu",
        "0.48",
    )
    assert code == 0
    for text in (
        "50,331,648 non-embedding",
        "38,597,376 embedding",
        "88,929,024",
        "6.091e+08 honest",
        "3.020e+08 the lab's 6N figure",
        "245,882",
        "1,688.3",
        "84,000 steps = 44.04B tokens",
        "49.8 h",
        "$54.73",
        "storage egress",
        "persistent disk",
        "buffer (1 restart)",
        "final checkpoint, export, shutdown (10 min)",
        "$0.18",
        "$62.91",
        "$35.00",
        "verdict: DOES NOT FIT",
        "do not fit in 24 h",
        "do not fit in $35.00",
        "in 24 h: 40,520 steps = 21.24B tokens, $34.58",
        "--total-steps 40520",
        "MFU 0.31 on h100/h200/h800",
        "E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28",
        "D = 44.04B tokens: 3.10",
        "2.93",
        "caveat",
        "SentencePiece",
    ):
        assert text in out, text


def test_24_hours_fit_the_cap(capsys):
    code, out, _ = run(
        capsys, "--gpu", "a100-80gb", "--rate-usd-per-hr", "1.10", "--hours", "24", "--budget-assumed-mfu", "0.48"
    )
    assert code == 0 and "verdict: FITS" in out and "40,520 steps = 21.24B tokens (24 h)" in out
    assert "$34.58" in out and "D = 21.24B tokens: 3.20" in out


def test_setup_hours_and_the_buffer(capsys):
    # The lab's own table: 26 h at $1.10 + $8 = $36.60 (+ $0.18 reserve), within $35 only if the buffer is
    # never used.
    code, out, _ = run(
        capsys,
        "--gpu",
        "a100-80gb",
        "--rate-usd-per-hr",
        "1.10",
        "--hours",
        "24",
        "--setup-hours",
        "2",
        "--budget-assumed-mfu",
        "0.48",
    )
    assert code == 0 and "$28.60" in out and "$36.78" in out and "only if the $5.00 restart buffer" in out


def test_measured_throughput_replaces_the_assumed_mfu(cfg, capsys):
    p = plan.make_plan(cfg, "a100-80gb", 1.10, plan.Ask(tokens_per_s=300_000, steps=84_000))
    assert p.measured and p.mfu(p.fpt.honest) == pytest.approx(300_000 * p.fpt.honest / 312e12)
    code, out, _ = run(capsys, "--gpu", "a100-80gb", "--rate-usd-per-hr", "1.10", "--tokens-per-s", "300000")
    assert code == 0 and "300,000 tokens/s measured: MFU 0.586 honest (0.290 in the lab's 6N accounting)" in out
    code, out, _ = run(capsys, "--rate-usd-per-hr", "1.10", "--tokens-per-s", "300000")
    assert code == 0 and "peak unknown" in out


def test_every_gpu_maps_to_a_peak_in_flops():
    for name, (key, mem) in plan.GPUS.items():
        assert plan.gpu_peak(name) == flops.PEAK_TFLOPS_BF16[key] and mem > 0
    assert plan.gpu_peak("A100-80GB") == 312.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "b200", "--rate-usd-per-hr", "1.1"], "--gpu 'b200' is not in the table; choose one of a100-80gb"),
        (["--gpu", "a100-80gb", "--rate-usd-per-hr", "0"], "--rate-usd-per-hr 0.0 must be positive"),
        (
            ["--gpu", "a100-80gb", "--rate-usd-per-hr", "1.1", "--budget-assumed-mfu", "1.5"],
            "budget.assumed_mfu: must be in (0, 1], got 1.5",
        ),
        (["--rate-usd-per-hr", "1.1"], "--gpu is needed"),
    ],
)
def test_usage_mistakes_exit_2_with_the_fix(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == EXIT_USAGE and message in err and "Traceback" not in err and out == ""


def test_a_bad_config_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_layr: 8\n")
    assert plan_cli.main(["--config", str(bad), "--gpu", "h100", "--rate-usd-per-hr", "2"]) == EXIT_USAGE
    assert "did you mean model.n_layer" in capsys.readouterr().err
    with pytest.raises(X1Error):
        plan.gpu_peak("tpu-v5")


def test_plan_and_the_launch_gate_print_the_same_what_fits_number(cfg, tmp_path, capsys):
    """One planner: for the same inputs (rate, step time, cap, lines, buffer, reserve) plan's "largest run"
    and the launch gate's "about N steps fit" are the same number."""
    from datetime import datetime, timezone

    from x1_pretrain.budget.gate import LaunchPlan, fitting_steps, gate_problems
    from x1_pretrain.budget.guard import Limits, parse

    tokens_per_s = 246_000
    step_s = cfg.tokens_per_step() / tokens_per_s
    code, out, _ = run(
        capsys,
        "--gpu",
        "a100-80gb",
        "--rate-usd-per-hr",
        "1.10",
        "--tokens-per-s",
        str(tokens_per_s),
        "--total-steps",
        "84000",
        "--budget-max-hours",
        "48",
    )
    planned = int(out.split("the largest run inside both: ")[1].split(" steps")[0].replace(",", ""))
    snap = parse(
        {
            "spent_usd": 0.0,
            "rate_usd_per_hr": 1.10,
            "hours_elapsed": 0,
            "projected_total_usd": 0,
            "last_update_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    launch = LaunchPlan(total_steps=84000, steps_done=0, step_s=step_s)
    gate = fitting_steps(snap.snapshot, launch, Limits(35.0, 30.0))
    (problem,) = gate_problems(snap, launch, Limits(35.0, 30.0), 1.40)
    assert code == 0 and planned == gate and f"about {gate:,} steps in all fit" in problem
    runbook = (REPO / "docs" / "cloud-runbook.md").read_text()
    code, out, _ = run(capsys, "--gpu", "a100-80gb", "--rate-usd-per-hr", "1.10", "--hours", "24")
    best = out.split("the largest run inside both: ")[1].split(" steps")[0]
    assert f"--total-steps {best.replace(',', '')}" in runbook, "the runbook's step count is plan's (same inputs)"


def test_plan_shows_the_schedule_fitted_to_the_budget(capsys):
    code, out, _ = run(
        capsys,
        "--gpu",
        "a100-80gb",
        "--rate-usd-per-hr",
        "1.10",
        "--total-steps",
        "84000",
        "--budget-max-hours",
        "48",
        "--budget-fit",
    )
    assert code == 0
    fitted = out.split("fitted to the budget")[1]
    end = int(fitted.split("expected end: step ")[1].split(" ")[0].replace(",", ""))
    # (35 - 3 fixed - 0.18 reserve) / 1.10 h at MFU 0.40 = 28.9 h, inside the 48 h window; no buffer kept
    assert 40_000 < end < 41_500 and "of at most 84,000" in fitted and "$35.00 in all" in fitted
    start = int(fitted.split("decay: from step ")[1].split(" ")[0].replace(",", ""))
    assert start == end - int(-(-0.2 * end // 1))  # the last 20 % (rounded up) decays
    assert "train with --set optim.schedule=wsd" in fitted  # the lab config is cosine


def test_task_evaluations_are_priced_in_the_plan(cfg, capsys):
    """hellaswag's 10,042 items every 500 steps at 300,000 tokens/s: each evaluation ~1.64M tokens of forward
    passes at half the training speed, ~3.7 s; 81 of them over 40,000 steps (the last in the reserve) make
    each step longer and fewer steps fit."""
    from x1_pretrain.budget.money import EvalCost
    from x1_pretrain.evals.cost import eval_in_steps

    in_steps = eval_in_steps(["hellaswag"], None, cfg.tokens_per_step())
    base = plan.make_plan(cfg, "a100-80gb", 1.10, plan.Ask(tokens_per_s=300_000, steps=40_000))
    with_evals = plan.make_plan(
        cfg,
        "a100-80gb",
        1.10,
        plan.Ask(tokens_per_s=300_000, steps=40_000, evals=EvalCost(every=500, in_steps=in_steps)),
    )
    eval_s = 10042 * 163.8 / 3 / 0.5 / 300_000
    assert with_evals.eval_s == pytest.approx(eval_s)
    assert with_evals.hours == pytest.approx(base.hours + 80 * eval_s / 3600)
    assert with_evals.total_usd() == pytest.approx(base.total_usd() + 81 * eval_s / 3600 * 1.10)
    assert with_evals.steps_that_fit() < base.steps_that_fit()
    capped = plan.make_plan(
        cfg,
        "a100-80gb",
        1.10,
        plan.Ask(tokens_per_s=300_000, steps=40_000, evals=EvalCost(every=500, in_steps=in_steps, cap_s=1.0)),
    )
    assert capped.eval_s == 1.0  # train.eval_tasks_max_s cuts each evaluation there
    code, out, _ = run(
        capsys,
        "--gpu",
        "a100-80gb",
        "--rate-usd-per-hr",
        "1.10",
        "--total-steps",
        "40000",
        "--tokens-per-s",
        "300000",
        "--eval-tasks",
        "hellaswag",
        "--eval-tasks-every",
        "500",
    )
    assert code == 0
    for text in (
        "(task evals included)",
        "task evals   hellaswag (all items) every 500 steps and at the end: ~4 s",
        "80 runs",
        "task eval at the end (at most 300 s)",
    ):
        assert text in out, text
    code, _, err = run(capsys, "--gpu", "a100-80gb", "--rate-usd-per-hr", "1.10", "--eval-tasks", "mmlu")
    assert code == EXIT_USAGE and "unknown task 'mmlu'" in err


def test_two_nodes_double_the_gpus_the_rate_and_the_disk(capsys):
    """`plan --nodes 2`: twice the GPUs (half the hours for the same steps), twice the hourly rate and the disk
    line; so the same steps cost the same compute, plus a second disk."""
    common = (
        "--gpu",
        "a100-80gb",
        "--rate-usd-per-hr",
        "1.10",
        "--total-steps",
        "20000",
        "--budget-assumed-mfu",
        "0.48",
    )
    code, one, _ = run(capsys, *common)
    code2, two, _ = run(capsys, *common, "--nodes", "2")
    assert code == code2 == 0
    assert "2 nodes x 1 GPU(s): $2.20/h and $4.00 of disk for all of them (run budget_sidecar --nodes 2" in two
    assert "on 2x a100-80gb" in two and "on 1x a100-80gb" in one
    hours = [float(t.split("time ")[1].split(" h")[0]) for t in (one, two)]
    assert hours[1] == pytest.approx(hours[0] / 2, abs=0.06)
    assert "compute (5.9 h x $2.20/h)" in two and "persistent disk                                  $4.00" in two
    assert run(capsys, *common, "--nodes", "0")[0] == EXIT_USAGE
