"""The in-loop task scores: at their cadence and at the end, logged as eval/<task>/acc(_norm); an evaluation
that fails (out of memory included), runs out of time or meets a stop never costs the run."""

from __future__ import annotations

import pytest
import torch

from x1_pretrain.core.contract import EXIT_INTERRUPTED, EXIT_OK
from x1_pretrain.data.tokenizer import load_gpt2
from x1_pretrain.evals import registry
from x1_pretrain.trainer import task_eval
from x1_pretrain.trainer.loop import Callback, LoopState, train_loop
from x1_pretrain.trainer.task_eval import TaskEval

from .test_loop import tiny_run

PIQA = [{"goal": f"Goal {i}", "sol1": "do this", "sol2": "do that instead", "label": i % 2} for i in range(6)]


class Tracker:
    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.tags: dict[str, str] = {}

    def log_metrics(self, step, metrics):
        self.metrics.setdefault(step, {}).update(metrics)

    def set_tags(self, tags):
        self.tags.update(tags)


def with_eval(total: int, every: int, extra=(), max_s: float = 60.0):
    from dataclasses import replace

    log: list[str] = []
    alerts: list[tuple[str, str]] = []
    evaluator = TaskEval(
        {"piqa": registry.items("piqa", PIQA)}, load_gpt2().encode, log.append, lambda s, b: alerts.append((s, b))
    )
    run = tiny_run(total, [evaluator, *extra])
    run.cfg = replace(
        run.cfg, train=replace(run.cfg.train, eval_tasks="piqa", eval_tasks_every=every, eval_tasks_max_s=max_s)
    )
    run.tracker = Tracker()
    return run, evaluator, log, alerts


def test_scores_are_logged_at_their_cadence_and_at_the_end():
    run, evaluator, log, _ = with_eval(10, every=4)
    outcome = train_loop(run, LoopState())
    assert outcome.exit_code == EXIT_OK
    logged = {s for s, m in run.tracker.metrics.items() if "eval/piqa/acc" in m}
    assert logged == {4, 8, 10}
    m = run.tracker.metrics[10]
    assert 0 <= m["eval/piqa/acc"] <= 1 and 0 <= m["eval/piqa/acc_norm"] <= 1
    assert sum("tasks (acc/acc_norm): piqa" in line and "(n=6 validation)" in line for line in log) == 3
    assert m["eval/piqa/n"] == 6  # the items scored, for the manifest
    assert run.raw_model.training  # back in training mode after each evaluation
    # what the budget counts: the latest evaluation's time, and all three in the time spent evaluating
    cost = evaluator.cost()
    assert cost.measured_s == evaluator.last_seconds > 0 and cost.spent_s > cost.measured_s


def test_a_failure_inside_the_eval_is_logged_alerted_once_and_training_goes_on(monkeypatch):
    run, evaluator, log, alerts = with_eval(9, every=3)
    calls = {"n": 0}

    def oom(task, items, scorer):
        calls["n"] += 1
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(task_eval, "score", oom)
    outcome = train_loop(run, LoopState())
    assert outcome.exit_code == EXIT_OK and outcome.step == 9 and calls["n"] == 3
    assert sum("task eval at step" in line and "failed (OutOfMemoryError" in line for line in log) == 3
    assert len(alerts) == 1 and "training goes on" in alerts[0][0]
    assert "OutOfMemoryError" in run.tracker.tags["eval_tasks_failed"]
    assert not any("eval/piqa/acc" in m for m in run.tracker.metrics.values())
    assert evaluator.cost().measured_s is None  # a failed evaluation says nothing of what one costs


def test_an_eval_past_its_time_is_cut_and_says_what_was_skipped():
    run, _, log, _ = with_eval(4, every=2, max_s=1e-9)
    assert train_loop(run, LoopState()).exit_code == EXIT_OK
    assert any("cut short (train.eval_tasks_max_s" in line and "piqa not scored" in line for line in log)


def test_a_stop_during_an_eval_ends_it_and_the_run_stops_with_its_checkpoint():
    class StopInsideEval(Callback):
        """SIGTERM arrives while the eval of step 2 runs (the eval checks the stop flag between batches)."""

        def after_step(self, run, state, report):
            if report.step == 2:
                run.stop.requested, run.stop.requested_at = "SIGTERM", run.clock()
            return None

    run, evaluator, log, _ = with_eval(10, every=2)
    run.callbacks.insert(0, StopInsideEval())  # before the eval at step 2
    outcome = train_loop(run, LoopState())
    assert (outcome.exit_code, outcome.step) == (EXIT_INTERRUPTED, 2)
    assert any("cut short (SIGTERM received)" in line for line in log)
    assert run.checkpointer.saved[-1] == (2, "interrupted by SIGTERM", True)
    assert evaluator.cost().measured_s is None  # cut by a stop: not what a whole one costs


@pytest.mark.parametrize("bad", ["piqa,mmlu"])
def test_an_unknown_task_stops_the_trainer_before_it_starts(demo_data, tmp_path, capsys, bad):
    from x1_pretrain import train

    from ..conftest import FAST, TINY

    code = train.main(
        [
            "--config",
            str(TINY),
            "--data-dir",
            str(demo_data),
            "--ckpt-dir",
            str(tmp_path / "c"),
            "--total-steps",
            "2",
            *FAST,
            "--eval-tasks",
            bad,
        ]
    )
    assert code == 2 and "unknown task 'mmlu'; choose among hellaswag" in capsys.readouterr().err


def test_the_trainer_logs_task_scores_to_mlflow(demo_data, tmp_path, capfd):
    """End to end on the real sets (cached by make's set-up): at the cadence and at the final step."""
    from x1_pretrain import train
    from x1_pretrain.evals import sets

    from ..conftest import FAST, TINY
    from ..procs import run_info

    if not all((sets.cache_dir() / f"{t}.arrow").is_file() for t in ("piqa", "winogrande")):
        pytest.skip("the eval sets are not cached (python -m x1_pretrain.evaluate --fetch)")
    ckpt = tmp_path / "c"
    assert (
        train.main(
            [
                "--config",
                str(TINY),
                "--data-dir",
                str(demo_data),
                "--ckpt-dir",
                str(ckpt),
                "--total-steps",
                "4",
                *FAST,
                "--eval-tasks",
                "piqa,winogrande",
                "--eval-tasks-every",
                "2",
                "--eval-tasks-limit",
                "4",
            ]
        )
        == 0
    )
    client, runs = run_info(ckpt)
    rid = runs[0].info.run_id
    acc = {m.step: m.value for m in client.get_metric_history(rid, "eval/piqa/acc")}
    # a share of the 4 items (3 at seq_len 32: one PIQA answer alone is longer and is skipped, as the harness would)
    assert sorted(acc) == [2, 4] and all(any(abs(v * n - round(v * n)) < 1e-9 for n in (3, 4)) for v in acc.values())
    assert [m.step for m in client.get_metric_history(rid, "eval/winogrande/acc")] == [2, 4]
    # the items each task actually scored, recorded and printed per task (not the first task's n for all)
    n = {t: [m.value for m in client.get_metric_history(rid, f"eval/{t}/n")] for t in ("piqa", "winogrande")}
    assert n == {"piqa": [3.0, 3.0], "winogrande": [4.0, 4.0]}
    out = "".join(capfd.readouterr())
    assert "(n=3 validation, 1 skipped)" in out and "(n=4 validation)" in out
    assert client.get_metric_history(rid, "eval/winogrande/acc_norm") == []
