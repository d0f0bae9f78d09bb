"""The training loop driven with fakes (the loop's docstring promises it): a real tiny Transformer and optimizer,
batches made in the test, hooks that act at chosen step boundaries, a checkpointer that records."""

from __future__ import annotations

import itertools

import pytest
import torch

from x1_pretrain.core import config as C
from x1_pretrain.data.tokens import Batch
from x1_pretrain.model.transformer import Transformer
from x1_pretrain.trainer.callbacks import loop_callbacks
from x1_pretrain.trainer.loop import Callback, LoopState, Run, train_loop
from x1_pretrain.trainer.optim import build_optimizer
from x1_pretrain.trainer.schedule import fitted_end, planned

from ..conftest import TINY

SETS = [
    "model.seq_len=16",
    "model.n_layer=1",
    "train.eval_batches=1",
    "optim.warmup_steps=2",
    "train.log_every=5",
    "train.eval_every=12",
    "optim.schedule=wsd",
    "optim.decay_fraction=0.5",
    "train.batch_size=2",
    "train.micro_batch_size=2",
    "train.grad_accum_steps=1",
]


class RecordingCheckpointer:
    def __init__(self) -> None:
        self.saved: list[tuple[int, str, bool]] = []

    def save(self, run, state, reason, required=False) -> None:
        self.saved.append((state.step, reason, required))

    def wait(self) -> None:
        return None

    def due(self, step, every_steps, every_min):
        return "periodic" if step % every_steps == 0 else None


def tiny_run(total_steps: int, hooks: list, *sets: str) -> Run:
    cfg = C.load(TINY, {"train.total_steps": total_steps}, [*SETS, *sets])
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    optimizer = (
        build_optimizer(model, cfg, torch.device("cpu"))
        if cfg.optim.name == "muon"
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    gen = torch.Generator().manual_seed(1)

    def batches():
        for step in itertools.count():
            x = torch.randint(0, 1000, (2, cfg.model.seq_len + 1), generator=gen)
            yield Batch(step, 0, x[:, :-1], x[:, 1:])

    val = [(torch.zeros(1, cfg.model.seq_len, dtype=torch.long), torch.zeros(1, cfg.model.seq_len, dtype=torch.long))]
    return Run(
        cfg,
        model,
        model,
        optimizer,
        torch.device("cpu"),
        batches(),
        [0],
        val,
        flops_per_token=1,
        peak_tflops=None,
        console=Console(),
        checkpointer=RecordingCheckpointer(),
        callbacks=[*loop_callbacks(), *hooks],
    )


class Console(list):
    def __call__(self, msg: str) -> None:
        self.append(msg)


class ProposeAt(Callback):
    """What --budget-fit's check does, at a chosen boundary: the end it proposes is the one ``fitted_end``
    computes when ``fit`` steps fit at a check made during step ``at`` (so ``steps_done`` was ``at - 1``)."""

    def __init__(self, at: int, fit: int) -> None:
        self.at, self.fit, self.lrs = at, fit, {}

    def after_step(self, run, state, report):
        self.lrs[state.step] = report.metrics["train/lr"]
        if state.step == self.at:
            run.proposed_end = fitted_end(self.at - 1, self.fit, run.cfg.train.total_steps)
        return None


@pytest.mark.parametrize("fit", [1, 2, 3])
def test_every_end_the_fit_proposes_is_honoured_however_near(fit):
    """One, two or three steps fit (the end lands on this boundary, or the next): the loop ends exactly there,
    with the final checkpoint and exit 0, instead of dropping the end and training on at the old rate."""
    hook = ProposeAt(at=12, fit=fit)
    run = tiny_run(40, [hook])
    end = fitted_end(11, fit, 40)
    outcome = train_loop(run, LoopState())
    assert outcome.exit_code == 0 and outcome.step == end == max(12, 11 + fit - 1)
    assert run.checkpointer.saved[-1] == (end, "final", True)
    assert "budget fitted" in outcome.reason
    assert max(hook.lrs) == end
    lines = run.console
    assert sum(f"step {end:>7}/" in line for line in lines) == 1  # the last step is logged, once
    assert sum(f"step {end:>7} | val loss" in line for line in lines) == 1  # and evaluated once
    if end > 12:  # an end after this boundary: the steps left decay to min_lr
        assert hook.lrs[end] == pytest.approx(run.cfg.optim.min_lr)


def test_a_fitted_end_decays_muons_matrices_and_adamws_rest_together():
    """With optim.name=muon the fit's new end moves both optimizers' schedules: at the fitted end Muon's lr is
    muon_lr x (min_lr / lr), AdamW's is min_lr, and the decay between was one curve for both."""

    class MuonLrs(ProposeAt):
        def __init__(self, at: int, fit: int) -> None:
            super().__init__(at, fit)
            self.muon: dict[int, float] = {}

        def after_step(self, run, state, report):
            self.muon[state.step] = run.optimizer.muon.param_groups[0]["lr"]
            return super().after_step(run, state, report)

    hook = MuonLrs(at=12, fit=3)
    run = tiny_run(40, [hook], "optim.name=muon", "optim.muon_lr=0.02")
    outcome = train_loop(run, LoopState())
    o = run.cfg.optim
    assert outcome.exit_code == 0 and outcome.step == fitted_end(11, 3, 40) == 13
    assert hook.lrs[13] == pytest.approx(o.min_lr) and hook.muon[13] == pytest.approx(0.02 * o.min_lr / o.lr)
    assert all(hook.muon[s] == pytest.approx(0.02 * hook.lrs[s] / o.lr) for s in hook.lrs)


def test_without_a_proposal_the_planned_end_stands():
    run = tiny_run(8, [])
    assert train_loop(run, LoopState()).step == 8 and run.horizon == planned(8, run.cfg.optim)


class RecordingTracker:
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict]] = []

    def log_metrics(self, step, values) -> None:
        self.calls.append((step, dict(values)))


class Records(Callback):
    """A component with a metric of its own: it names the value and records it; the loop does the logging."""

    def after_step(self, run, state, report):
        run.record_metric(state.step, "train/my_value", float(state.step) * 2)
        if state.step == 7:
            raise RuntimeError("a crash after recording")
        return None


def test_a_callbacks_metric_is_logged_with_the_steps_values_in_one_call_and_never_lost():
    """record_metric: each step's values (the loop's, the val loss, a callback's own) reach the tracker in one
    call per step at the boundary, and what was recorded before a crash is still delivered."""
    run = tiny_run(10, [Records()])
    run.tracker = RecordingTracker()
    with pytest.raises(RuntimeError, match="a crash after recording"):
        train_loop(run, LoopState())
    steps = [s for s, _ in run.tracker.calls]
    assert steps == sorted(set(steps)), "one call per step, in order"
    by_step = dict(run.tracker.calls)
    assert by_step[0] == {"val/loss": by_step[0]["val/loss"]}  # the starting point of the val curve
    assert by_step[1]["train/my_value"] == 2.0 and "train/loss" in by_step[1] and "train/first_step_s" in by_step[1]
    assert by_step[5]["train/my_value"] == 10.0 and "train/tokens_per_s" in by_step[5]  # a logging step
    assert by_step[6] == {"train/my_value": 12.0}  # not a logging step: only the callback's value
    assert by_step[7] == {"train/my_value": 14.0}  # recorded, then the crash: delivered by the loop's finally
