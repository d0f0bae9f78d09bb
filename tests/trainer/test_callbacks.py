"""The loop's callbacks, each on its phase, driven with the fakes of test_loop: the checkpoint cadence, a
SIGUSR1 served at the boundary, the eval cadence, the throughput floor, the progress file and the stop timing."""

from __future__ import annotations

import json
from dataclasses import replace

from x1_pretrain.core.contract import EXIT_INTERRUPTED, EXIT_SLOW
from x1_pretrain.trainer.callbacks import ProgressFile, ThroughputFloor
from x1_pretrain.trainer.loop import Callback, LoopState, train_loop

from .test_loop import tiny_run


class At(Callback):
    """Does something at the boundary after step ``at``."""

    def __init__(self, at: int, action) -> None:
        self.at, self.action = at, action

    def after_step(self, run, state, report):
        if report.step == self.at:
            self.action(run)
        return None


def test_checkpoints_follow_the_cadence_and_a_sigusr1_is_served_at_its_boundary():
    def usr1(run):
        run.stop.checkpoint_now = True

    run = tiny_run(10, [At(3, usr1)])
    run.cfg = replace(run.cfg, checkpoint=replace(run.cfg.checkpoint, every_steps=4))
    outcome = train_loop(run, LoopState())
    assert outcome.exit_code == 0
    assert run.checkpointer.saved == [
        (3, "requested (SIGUSR1)", False),
        (4, "periodic", False),
        (8, "periodic", False),
        (10, "final", True),
    ]
    assert run.stop.checkpoint_now is False
    vals = [line for line in run.console if "val loss" in line]
    assert [int(v.split()[1]) for v in vals] == [0, 10]  # eval_every 12: the start and the end only


def test_a_stop_by_signal_checkpoints_and_says_how_long_it_took():
    def term(run):
        run.stop.requested, run.stop.requested_at = "SIGTERM", run.clock()

    run = tiny_run(10, [At(2, term)])
    outcome = train_loop(run, LoopState())
    assert (outcome.exit_code, outcome.step) == (EXIT_INTERRUPTED, 2)
    assert run.checkpointer.saved[-1] == (2, "interrupted by SIGTERM", True)
    assert any(line.startswith("clean stop ") and line.endswith(" s after SIGTERM") for line in run.console)


def test_the_floor_ends_the_run_in_its_window_and_later_callbacks_are_not_asked():
    class Asked(Callback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def after_step(self, run, state, report):
            self.steps.append(report.step)
            return None

    asked = Asked()
    run = tiny_run(30, [asked])
    run.cfg = replace(run.cfg, train=replace(run.cfg.train, min_tokens_per_s=1e12, throughput_window=2, log_every=1))
    assert any(isinstance(cb, ThroughputFloor) for cb in run.callbacks)
    outcome = train_loop(run, LoopState())
    assert outcome.exit_code == EXIT_SLOW and run.checkpointer.saved[-1][2] is True
    assert asked.steps == list(range(1, outcome.step))  # not asked at the step the floor ended the run


def test_the_progress_file_is_written_after_each_checkpoint(tmp_path):
    class Saved:
        last_saved_step = 0

    progress = ProgressFile(tmp_path, 0.0, Saved())
    run = tiny_run(6, [progress])
    Saved.last_saved_step = 5
    progress.after_checkpoint(run, LoopState(step=5), "periodic")
    info = json.loads((tmp_path / "progress.json").read_text())
    assert (info["step"], info["last_checkpoint_step"], info["total_steps"]) == (5, 5, 6)
