"""The loop's checkpointer on a disk that fills and frees again: real step dirs, a write that fails where a full
disk raises (inside the step-dir write), a clock the test moves, the cadence the loop asks for (``due``)."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.ckpt.checkpointer import CheckpointCalls, Checkpointer
from x1_pretrain.core.errors import CheckpointFailed
from x1_pretrain.model.transformer import Transformer, state_dict_for_saving

from .test_checkpoint import SMALL


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def disk(monkeypatch):
    """``disk.full`` makes every step-dir write fail with ENOSPC part-way, as a full disk does."""
    real = ck._fill_step_dir
    state = SimpleNamespace(full=False, writes=0)

    def fill(tmp, snap):
        state.writes += 1
        if not state.full:
            return real(tmp, snap)
        (tmp / ck.MODEL_FILE).write_bytes(b"\0" * 512)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / ck.OPTIM_FILE))

    monkeypatch.setattr(ck, "_fill_step_dir", fill)
    return state


def _checkpointer(tmp_path, async_save: bool, clock: Clock, events: list) -> tuple[Checkpointer, SimpleNamespace]:
    model = Transformer(SMALL)
    run = SimpleNamespace(raw_model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    calls = CheckpointCalls(
        state_dict_for_saving,
        lambda run, state: {"step": state.step, "rng": ck.rng_state()},
        log=lambda msg: events.append(("log", msg)),
        on_failed=lambda step, reason, what, first: events.append(("failed", step, first)),
        on_recovered=lambda step, n: events.append(("recovered", step, n)),
    )
    return Checkpointer(tmp_path / "ckpt", 3, async_save, calls, clock=clock), run


@pytest.mark.parametrize("async_save", [True, False])
def test_a_full_disk_is_retried_on_schedule_with_one_alert_per_episode(tmp_path, disk, async_save):
    """--checkpoint-every-min 15, a step a minute, 200 steps; the disk is full from minute 20 to minute 100. Attempts
    come every 15 minutes, failed or not (not at every step), training goes on in both save modes, one alert
    opens the episode and one closes it when a write succeeds again."""
    clock, events = Clock(), []
    chk, run = _checkpointer(tmp_path, async_save, clock, events)
    attempts = []
    for step in range(1, 201):
        clock.now += 60
        disk.full = 20 <= step < 100
        why = chk.due(step, every_steps=10_000, every_min=15)
        if why:
            attempts.append(step)
            chk.save(run, SimpleNamespace(step=step), why)  # never raises for a periodic checkpoint
            chk.wait()
    assert attempts == list(range(15, 201, 15))
    failed = [e for e in events if e[0] == "failed"]
    assert [s for _, s, _ in failed] == [30, 45, 60, 75, 90]  # each attempt of the episode, reported
    assert [first for *_, first in failed] == [True, False, False, False, False]  # alerted once
    assert [e for e in events if e[0] == "recovered"] == [("recovered", 105, 5)]
    assert ck.read_latest(tmp_path / "ckpt") == "step_0000195" and chk.failures == 5
    assert not any(".tmp-" in p.name for p in (tmp_path / "ckpt").iterdir())


def test_step_cadence_retries_at_the_next_boundary_and_a_required_write_still_raises(tmp_path, disk):
    clock, events = Clock(), []
    chk, run = _checkpointer(tmp_path, False, clock, events)
    disk.full = True
    for step in (10, 20):
        assert chk.due(step, every_steps=10, every_min=0) == "periodic" and chk.due(step + 1, 10, 0) is None
        chk.save(run, SimpleNamespace(step=step), "periodic")
    assert [e[1:] for e in events if e[0] == "failed"] == [(10, True), (20, False)]
    with pytest.raises(CheckpointFailed):  # the final or a stop's checkpoint: the run must end with exit 7
        chk.save(run, SimpleNamespace(step=21), "interrupted by SIGTERM", required=True)
    disk.full = False
    chk.save(run, SimpleNamespace(step=30), "periodic")
    assert events[-1][0] == "recovered" and ck.read_latest(tmp_path / "ckpt") == "step_0000030"
