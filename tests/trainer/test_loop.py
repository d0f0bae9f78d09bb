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


def tiny_run(total_steps: int, hooks: list) -> Run:
    cfg = C.load(TINY, {"train.total_steps": total_steps}, SETS)
    torch.manual_seed(0)
    model = Transformer(cfg.model)
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
        torch.optim.AdamW(model.parameters(), lr=1e-3),
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


def test_without_a_proposal_the_planned_end_stands():
    run = tiny_run(8, [])
    assert train_loop(run, LoopState()).step == 8 and run.horizon == planned(8, run.cfg.optim)
