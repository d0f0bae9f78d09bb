"""The builder: a Run assembled from the config and the flags, its callbacks in order, a resume's schedule and
spike state restored, and the trainer_state.json it writes built whole."""

from __future__ import annotations

import time

import torch

from x1_pretrain.core import config as C
from x1_pretrain.launch.build import Built, Context, build_run
from x1_pretrain.launch.options import build_parser, options_from
from x1_pretrain.trainer.distributed import World
from x1_pretrain.trainer.loop import LoopState, StopFlag
from x1_pretrain.trainer.schedule import planned

from ..conftest import FAST, TINY

LOOP = ["FirstStepTiming", "EvalCadence", "ValLog", "ThroughputFloor", "CheckpointCadence", "StopTiming"]


def built_for(tmp_path, data, *flags: str) -> tuple[Built, list[str]]:
    args = build_parser().parse_args(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(data),
            "--ckpt-dir",
            str(tmp_path / "c"),
            "--no-compile",
            *FAST,
            *flags,
        ]
    )
    opts = options_from(args)
    cfg = C.load(opts.config, opts.overrides, list(opts.sets))
    log: list[str] = []
    ctx = Context(cfg, opts, World(), torch.device("cpu"), log.append, StopFlag(), time.time())
    return build_run(ctx), log


def close(built: Built) -> None:
    if built.checkpointer is not None:
        built.checkpointer.wait()
    built.tracker.close("FINISHED")


def test_the_run_is_assembled_from_the_config_with_its_callbacks_in_order(demo_data, tmp_path):
    built, log = built_for(
        tmp_path, demo_data, "--total-steps", "6", "--inject-spike-at-step", "3", "--set", "train.eval_batches=3"
    )
    try:
        run = built.run
        assert [type(cb).__name__ for cb in run.callbacks] == [*LOOP, "ProgressFile", "SpikeWatch"]
        assert built.guard is None  # no cap: no budget guard
        spike = run.callbacks[-1]
        assert spike.injector is not None and spike.injector.schedule.at_step == 3
        assert len(run.val_batches) == 3 and all(x.shape == (8, 32) for x, _ in run.val_batches)
        assert run.chunks == [0, 1] and run.horizon == planned(6, run.cfg.optim)
        assert any("spike injection planned: steps 3..7" in line for line in log)
        state = built.checkpointer._calls.trainer_state(run, LoopState(step=2, tokens_seen=1024))
        assert state["config"] == run.cfg.to_dict() and state["config_sha256"] == run.cfg.sha256()
        assert state["data_identity"] == built.data.identity and state["mlflow_run_id"] == built.tracker.run_id
        assert state["step"] == 2 and state["spike"]["injection_cancelled"] is None and state["budget_guard"] is None
        assert state["data_position"] == {
            "next_step": 2,
            "seed": 42,
            "chunks_per_step": 2,
            "micro_batch_size": 8,
            "epoch": built.sampler.epoch_of(2),
        }
    finally:
        close(built)


def test_a_cap_adds_the_budget_guard_last(demo_data, tmp_path):
    budget = tmp_path / "budget.json"
    built, _ = built_for(tmp_path, demo_data, "--total-steps", "6")
    close(built)
    from x1_pretrain.budget import alerts
    from x1_pretrain.launch.session import budget_limits
    from x1_pretrain.trainer.budget_control import BudgetControl, BudgetSetup

    opts = options_from(
        build_parser().parse_args(
            [
                "--config",
                str(TINY),
                "--data-dir",
                str(demo_data),
                "--ckpt-dir",
                str(tmp_path / "g"),
                "--no-compile",
                *FAST,
                "--budget-cap-usd",
                "9",
                "--budget-alert-usd",
                "8",
                "--budget-curr-cost-uri",
                str(budget),
            ]
        )
    )
    cfg = C.load(opts.config, opts.overrides, list(opts.sets))
    limits = budget_limits(opts, cfg.budget)
    assert limits is not None and limits.cap_usd == 9.0
    setup = BudgetSetup(cfg.budget, str(budget), limits, alerter=alerts.from_env())
    ctx = Context(cfg, opts, World(), torch.device("cpu"), [].append, StopFlag(), time.time(), guard=setup)
    built = build_run(ctx)
    try:
        assert isinstance(built.run.callbacks[-1], BudgetControl) and built.guard is built.run.callbacks[-1]
    finally:
        built.guard.close()
        close(built)
