"""Task scores during training (``train.eval_tasks``): a loop callback on rank 0 that scores the model on the
configured tasks every ``train.eval_tasks_every`` steps and once more when the run ends, and logs
``eval/<task>/acc``, ``eval/<task>/acc_norm`` and ``eval/<task>/n`` (the items actually scored); its log line
gives each task's own n and split.

An evaluation never costs the run: it runs on the plain eager model under ``inference_mode`` in batches of the
training micro-batch, it stops at ``train.eval_tasks_max_s`` (the scores of the tasks finished by then are
logged, the rest skipped, and it says so), a stop signal ends it at the next batch so the loop's stop goes
ahead, and any failure inside it (out of memory included) is logged, tagged, alerted once and skipped while
training goes on. The budget counts its cost (``cost()``): its measured seconds (estimated from its size before the
first one), once every ``train.eval_tasks_every`` steps and once in the reserve for the end of the run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from ..budget.money import EvalCost
from ..core import names as N
from ..core.contract import EXIT_BUDGET_CHECKPOINT, EXIT_OK
from ..evals.registry import TASKS
from ..evals.score import Scorer, TaskScore, score
from ..evals.tasks import Item
from .loop import Callback, LoopState, Outcome, Run, StepReport, Verdict, scoring_mode


class EvalCut(Exception):
    """The evaluation ran out of its time, or a stop came: what is scored so far stands."""


class TaskEval(Callback):
    """Scores ``items`` ({task: items}) with ``encode`` at the configured steps and at the end of the run."""

    def __init__(
        self,
        items: dict[str, list[Item]],
        encode: Callable[[str], list[int]],
        log: Callable[[str], None],
        alert: Callable[[str, str], None] | None = None,
        estimate: EvalCost | None = None,
    ) -> None:
        self.items, self.encode, self.log, self.alert = items, encode, log, alert
        self.estimate = estimate or EvalCost()  # the cost before one is measured (period, size, time cap)
        self.last_step = -1
        self.failures = 0
        self.last_seconds = 0.0  # how long the latest evaluation took
        self.spent_s = 0.0  # all evaluations of this process
        self.measured_s: float | None = None  # the latest evaluation that ran to its end (or to its time cap)

    def cost(self) -> EvalCost:
        """What the budget counts for the evaluations: measured once one has run, estimated before."""
        return replace(self.estimate, measured_s=self.measured_s, spent_s=self.spent_s)

    def after_step(self, run: Run, state: LoopState, report: StepReport) -> Verdict | None:
        every = run.cfg.train.eval_tasks_every
        if every and report.step % every == 0 and report.step != run.end_step:
            self.evaluate(run, state)
        return None

    def on_stop(self, run: Run, state: LoopState, outcome: Outcome) -> None:
        if outcome.exit_code == EXIT_OK and self.last_step != state.step:
            self.evaluate(run, state)  # the scores of the weights the run ends with
        elif outcome.exit_code == EXIT_BUDGET_CHECKPOINT:
            self.log(
                "task eval: not run at the budget stop (the money is for the checkpoint and the export); "
                "score the final weights with python -m x1_pretrain.evaluate"
            )

    def evaluate(self, run: Run, state: LoopState) -> list[TaskScore]:
        t = run.cfg.train
        t0 = time.monotonic()
        deadline = t0 + t.eval_tasks_max_s
        done: list[TaskScore] = []
        self.last_step = state.step
        timed = True  # whether this evaluation's seconds say what the next will cost

        def check() -> None:
            if run.stop.requested is not None:
                raise EvalCut(f"{run.stop.requested} received")
            if time.monotonic() > deadline:
                raise EvalCut(f"train.eval_tasks_max_s {t.eval_tasks_max_s:g} s passed")

        bf16 = t.precision == "bf16" and run.device.type == "cuda"
        scorer = Scorer(run.raw_model, self.encode, t.micro_batch_size, bf16, check=check)
        try:
            with scoring_mode(run.raw_model):
                for task, items in self.items.items():
                    done.append(score(task, items, scorer))
        except EvalCut as e:
            left = [task for task in self.items if task not in {s.task for s in done}]
            self.log(f"task eval at step {state.step} cut short ({e}): {', '.join(left)} not scored this time")
            timed = run.stop.requested is None  # cut by its time cap: the next one will take as long
        except Exception as e:  # out of memory included: the eval never ends the run
            self._failed(run, state, e)
            timed = False
        self.last_seconds = time.monotonic() - t0
        self.spent_s += self.last_seconds
        if timed:
            self.measured_s = self.last_seconds
        self._report(run, state, done)
        return done

    def _report(self, run: Run, state: LoopState, done: list[TaskScore]) -> None:
        metrics: dict[str, float] = {}
        for s in done:
            metrics[N.eval_task_metric(s.task, "acc")] = s.acc
            if s.acc_norm is not None:
                metrics[N.eval_task_metric(s.task, "acc_norm")] = s.acc_norm
            metrics[N.eval_task_metric(s.task, "n")] = float(s.n)  # the items scored (the manifest's n)
        run.metrics.record(state.step, {k: v for k, v in metrics.items() if math.isfinite(v)})
        if done:
            parts = [
                f"{s.task} {s.acc:.3f}"
                + (f"/{s.acc_norm:.3f}" if s.acc_norm is not None else "")
                + f" (n={s.n} {TASKS[s.task].split if s.task in TASKS else '?'}"
                + (f", {s.skipped} skipped" if s.skipped else "")
                + ")"
                for s in done
            ]
            self.log(f"step {state.step:>7} | tasks (acc/acc_norm): {', '.join(parts)} ({self.last_seconds:.1f} s)")

    def _failed(self, run: Run, state: LoopState, error: BaseException) -> None:
        import torch

        self.failures += 1
        what = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
        if run.device.type == "cuda":
            torch.cuda.empty_cache()
        self.log(f"WARNING: task eval at step {state.step} failed ({what}); training goes on without it")
        if run.tracker is not None and hasattr(run.tracker, "set_tags"):
            run.tracker.set_tags({N.TAG_EVAL_TASKS_FAILED: f"step {state.step}: {what}"[:4000]})
        if self.alert is not None and self.failures == 1:
            self.alert(
                f"x1 task eval failed at step {state.step}: training goes on",
                f"The in-loop task evaluation raised {what}. It was skipped and training continues; the "
                "next evaluation is tried on schedule (no further alert).",
            )
