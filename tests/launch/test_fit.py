"""--budget-fit end to end, with real processes and a billing simulation in which the cap arrives early."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import pytest

from x1_pretrain import train
from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import contract
from x1_pretrain.core.safetensors_io import load as load_st
from x1_pretrain.demo.billing import StepBilling

from ..conftest import TINY
from ..procs import run_info, start, train_cmd, train_here, wait_for

CAP = 10.0
WSD = ["--set", "optim.schedule=wsd", "--set", "optim.decay_fraction=0.5", "--set", "optim.warmup_steps=2"]


def fit_args(budget: Path, *extra: str, cap: float = CAP) -> list[str]:
    return [
        *WSD,
        "--budget-fit",
        "--budget-cap-usd",
        str(cap),
        "--budget-alert-usd",
        str(cap * 0.95),
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-check-every-min",
        "0.003",
        "--budget-reserve-min",
        "0.005",
        "--budget-buffer-usd",
        "0",
        "--budget-expected-step-s",
        "0.2",
        "--force-launch",
        *extra,
    ]


def history(ckpt: Path, key: str) -> dict[int, float]:
    client, runs = run_info(ckpt)
    return {m.step: m.value for m in client.get_metric_history(runs[0].info.run_id, key)}


def test_cosine_with_fit_to_budget_is_refused_with_the_fix(tmp_path, capsys):
    code = train.main(
        ["--config", str(TINY), "--data-dir", str(tmp_path), "--ckpt-dir", str(tmp_path / "c"), "--budget-fit"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "budget.fit: needs optim.schedule 'wsd', not 'cosine'" in err
    assert "--set optim.schedule=wsd" in err


def test_the_cap_arrives_early_and_the_run_anneals_and_finishes_through_a_preemption(demo_data, tmp_path, capsys):
    """The price more than triples at step 10, so a fraction of the 400 steps asked for fit; a SIGTERM (spot
    preemption) arrives inside the decay and the run is resumed under the same billing. It ends with exit 0 at
    min_lr, final weights and a finished MLflow run, and the spend never passed the cap.
    The ledger charges the downtime between the two processes at the last rate (here ~$1 a second, so a
    slow restart costs dollars): the SIGTERM comes early in a long decay (80% of the run, so it begins soon after
    the price rises and few steps run before it) and the resume runs in this process (no interpreter start-up),
    so that the money left pays for the restart too and the resume compresses what remains of the decay."""
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    billing = StepBilling(budget, ckpt, lambda s: 0.06 if s < 10 else 0.2, free_start_up=True)
    decay = ("--set", "optim.decay_fraction=0.8")
    try:
        proc = start(train_cmd(demo_data, ckpt, 400, *fit_args(budget, *decay)), tmp_path / "a.log")

        def decaying() -> bool:
            m = re.findall(r"decay starts at step (\d+)", (tmp_path / "a.log").read_text())
            return bool(m) and int((contract.read_progress(ckpt) or {}).get("step") or 0) > int(m[-1]) + 1

        wait_for(decaying, proc=proc, timeout=300)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 75
        stopped, _ = ck.verify(ckpt / ck.read_latest(ckpt))
        # resumed in this process: no interpreter start-up in the downtime the ledger charges
        capsys.readouterr()
        resume = train_cmd(demo_data, ckpt, 400, *fit_args(budget, *decay), "--resume-from-latest")
        code = train.main(resume[resume.index("x1_pretrain.train") + 1 :])
    finally:
        billing.close()
    out = capsys.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-2000:]
    state, _ = ck.verify(ckpt / ck.read_latest(ckpt))
    last = state["step"]
    assert stopped["step"] < last < 400 and (ckpt / "final.safetensors").exists()
    assert state["schedule"]["decay_start"] == stopped["schedule"]["decay_start"]  # the decay was not restarted
    assert state["schedule"]["end_step"] == last
    lr = history(ckpt, "train/lr")
    assert lr[last] == pytest.approx(3e-4, rel=1e-9)  # the tiny config's min_lr, at the last step
    assert max(lr.values()) == pytest.approx(3e-3)
    spent = history(ckpt, "budget/spent_usd")
    assert max(spent.values()) <= CAP and list(spent.values()) == sorted(spent.values())
    assert billing.spent <= CAP  # the bill itself, not only what the guard saw
    ends = history(ckpt, "budget/planned_end_step")
    assert ends[max(ends)] == last and "budget fit: the run ends at step" in out.out
    _, runs = run_info(ckpt)
    assert runs[0].info.status == "FINISHED" and "budget fitted" in runs[0].data.tags["end_reason"]


def _first_inside_the_decay(ckpt: Path, seen: dict[str, int | None]) -> Path | None:
    """The first complete step dir whose own schedule puts it strictly inside the decay (each dir is verified
    once: a complete one never changes)."""
    for step, path in ck.list_step_dirs(ckpt):
        if path.name not in seen and (path / ck.DONE_FILE).exists():
            state, _ = ck.verify(path)
            inside = (
                state is not None and state["schedule"]["decay_start"] < state["step"] < state["schedule"]["end_step"]
            )
            seen[path.name] = step if inside else None
        if seen.get(path.name) is not None:
            return path
    return None


def _as_killed_after(ckpt: Path, step_dir: Path) -> None:
    """The checkpoint dir as a SIGKILL right after ``step_dir`` was written leaves it: later step dirs (complete
    or not), the final files and the exit status gone, ``latest`` naming it."""
    for _, path in ck.list_step_dirs(ckpt):
        if path.name > step_dir.name:
            shutil.rmtree(path)
    for leftover in ckpt.glob(".step_*.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for name in (ck.FINAL_MODEL, ck.FINAL_OPTIM, contract.EXIT_STATUS):
        (ckpt / name).unlink(missing_ok=True)
    (ckpt / ck.LATEST).write_text(step_dir.name + "\n")


def test_a_kill_inside_the_decay_resumes_the_same_schedule_bit_for_bit(demo_data, tmp_path):
    """A checkpoint dir as a SIGKILL right after a checkpoint inside the decay leaves it; the checkpoint is
    resumed twice, each time with the billing still moving. The ledger rightly charges the downtime at the last
    rate (a preemption gap costs money and would compress the decay), so the resumes get a higher cap, which
    leaves money for the rest of the decay: both continue the saved schedule to its end, at min_lr, with
    bitwise-equal weights.

    Every step is checkpointed and every step dir kept, so a checkpoint inside the decay exists however the
    clock-billed money compresses the run on a loaded machine (at $0.4 a step it once fitted 6 steps, decay
    from step 4). The run is trained to its fitted end in this process and the disk then cut back to the first
    such checkpoint, as a kill right after it leaves it (what a real SIGKILL leaves is test_checkpoint's; here
    it is the resume's schedule that is under test, and a run in this process and its resumes skip three
    interpreter start-ups)."""
    ckpt, budget = tmp_path / "c", tmp_path / "budget.json"
    async_off = [
        "--set",
        "checkpoint.async_save=false",
        "--set",
        "checkpoint.keep_last=100000",
        # half the FAST batch (grad accumulation still 2): the schedule's resume does not depend on it
        "--set",
        "train.batch_size=8",
        "--set",
        "train.micro_batch_size=4",
        "--set",
        "train.grad_accum_steps=2",
    ]
    per_step = 0.6  # $10 pays for ~16 steps: the decay starts near step 8, few checkpoints to write
    # until a step is measured the rate assumes 2 s a step: a slow machine's start-up (imports, the first step)
    # is then aged at $0.2/s by the guard, not at the $2/s of the steps it has not run yet
    billing = StepBilling(budget, ckpt, lambda s: per_step, free_start_up=True, step_s=2.0)
    try:
        assert train_here(train_cmd(demo_data, ckpt, 400, *fit_args(budget), *async_off, ckpt_every=1)) == 0
    finally:
        billing.close()
    target = _first_inside_the_decay(ckpt, {})
    assert target is not None
    _as_killed_after(ckpt, target)
    saved, _ = ck.verify(ckpt / ck.read_latest(ckpt))
    horizon, at = saved["schedule"], saved["step"]
    finals = []
    for twin in ("t1", "t2"):
        d = tmp_path / twin
        shutil.copytree(ckpt, d)
        (d / "progress.json").unlink(missing_ok=True)
        b = tmp_path / f"{twin}.json"
        bill = StepBilling(b, d, lambda s: 0.01, spent=per_step * at, step=at)
        try:
            code = train_here(
                train_cmd(demo_data, d, 400, *fit_args(b, cap=1000.0), *async_off, "--resume-from-latest")
            )
        finally:
            bill.close()
        assert code == 0
        final, _ = ck.verify(d / ck.read_latest(d))
        assert final["schedule"]["decay_start"] == horizon["decay_start"]  # the decay never restarts
        assert final["step"] == horizon["end_step"]  # nor is it stretched
        assert history(d, "train/lr")[final["step"]] == pytest.approx(3e-4, rel=1e-9)  # min_lr at the end
        finals.append(load_st(d / "final.safetensors"))
    import torch

    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
