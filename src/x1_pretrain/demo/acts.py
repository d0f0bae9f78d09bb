"""The demo's acts, each a sequence of the lab's own commands run as child processes.

Act 1, *a preempted run with a loss spike*: the tiny config under the watchdog, SIGTERM half-way (a spot
preemption: it checkpoints, exits 75 and the watchdog resumes it), a loss spike injected at three quarters
(the lab's DoD check 3), then export_run, the spike post-mortem and the DoD table.

Act 2, *the budget runs short half-way*: the same model on the WSD schedule with ``--budget-fit`` under a
simulated bill whose price doubles half-way; the run moves its end to what the money still pays for,
anneals to min_lr there and finishes (exit 0) inside the cap, and the DoD table reads its spend.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..core.contract import read_progress
from .billing import StepBilling

PY = sys.executable


TASKS = "hellaswag,arc_easy,arc_challenge,piqa,winogrande"


LOG_LEVEL = ["info"]  # the demo's --log-level, handed to every x1 command it runs


def leveled(cmd: list[str]) -> list[str]:
    """``cmd`` with the demo's ``--log-level`` after each ``-m x1_pretrain.<command>`` in it (the watchdog's and
    the train command's after ``--``); unchanged at the default level, so the commands read as a user types them."""
    if LOG_LEVEL[0] == "info":
        return cmd
    out: list[str] = []
    for i, part in enumerate(cmd):
        out.append(part)
        if i > 0 and cmd[i - 1] == "-m" and part.startswith("x1_pretrain."):
            out += ["--log-level", LOG_LEVEL[0]]
    return out


def run(cmd: list[str]) -> int:
    cmd = leveled(cmd)
    print("\n$ " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def train_cmd(config: Path, data: Path, run_dir: Path, total_steps: int, *extra: str) -> list[str]:
    return [
        PY,
        "-m",
        "x1_pretrain.train",
        "--config",
        str(config),
        "--data-dir",
        str(data),
        "--ckpt-dir",
        str(run_dir / "checkpoints"),
        "--mlflow-uri",
        (run_dir / "mlruns").as_uri(),
        "--total-steps",
        str(total_steps),
        "--ckpt-every",
        "100",
        "--eval-every",
        "50",
        "--log-every",
        "10",
        "--resume-from-latest",
        *extra,
    ]


def under_the_watchdog(train: list[str], ckpt: Path, preempt_at: int | None) -> int:
    """Run the trainer under the watchdog; preempt it once at ``preempt_at``, as a spot instance would be."""
    cmd = [PY, "-m", "x1_pretrain.watchdog", "--backoff-s", "1", "--", *train]
    print("\n$ " + " ".join(cmd), flush=True)
    watchdog = subprocess.Popen(leveled(cmd))
    preempted = preempt_at is None
    while watchdog.poll() is None:
        progress = read_progress(ckpt)
        if not preempted and progress and progress.get("step", 0) >= preempt_at:
            print(
                f"\n[demo] step {progress['step']}: sending SIGTERM to the trainer (pid {progress['pid']}), "
                "as a cloud would before preempting a spot instance\n",
                flush=True,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(progress["pid"]), signal.SIGTERM)
            preempted = True
        time.sleep(0.2)
    return watchdog.returncode


def bundle_and_dod(run_dir: Path, export_extra: list[str], postmortem: bool, dod_extra: tuple[str, ...] = ()) -> int:
    """The lab's shutdown steps: export the run, (draft the spike post-mortem,) check the Definition of Done."""
    bundle, uri = run_dir / "run-bundle", (run_dir / "mlruns").as_uri()
    code = run([PY, "-m", "x1_pretrain.export_run", "--mlflow-uri", uri, "--output", str(bundle), *export_extra])
    if code == 0 and postmortem:  # a person finishes its root-cause and lessons sections
        code = run(
            [PY, "-m", "x1_pretrain.postmortem", "--mlflow-uri", uri, "--output", str(bundle / "spike-postmortem.md")]
        )
    if code != 0:
        return code
    return run([PY, "-m", "x1_pretrain.dod", "--run-dir", str(bundle), *dod_extra])


def act_preemption_and_spike(config: Path, data: Path, run_dir: Path, total_steps: int) -> int:
    print("\n[demo] act 1: a preempted run with an injected loss spike", flush=True)
    train = train_cmd(
        config,
        data,
        run_dir,
        total_steps,
        "--inject-spike-at-step",
        str(total_steps * 3 // 4),
        "--eval-tasks",
        TASKS,
        "--eval-tasks-limit",
        "100",
    )
    code = under_the_watchdog(train, run_dir / "checkpoints", preempt_at=total_steps // 2)
    if code != 0:
        return code
    print(
        f"\n[demo] act 1 trained. Look at the run with:\n  MLFLOW_ALLOW_FILE_STORE=true .venv/bin/mlflow ui "
        f"--backend-store-uri {(run_dir / 'mlruns').as_uri()}   (needs the UI extra: .venv/bin/pip install -e "
        "'.[ui]')"
    )
    run(
        [
            PY,
            "-m",
            "x1_pretrain.evaluate",
            "--checkpoint",
            str(run_dir / "checkpoints"),
            "--tasks",
            TASKS,
            "--limit",
            "200",
            "--output",
            str(run_dir / "task-scores.json"),
        ]
    )
    print(
        "[demo] task scores of the tiny model: near chance, as they should be after a few minutes on a CPU "
        "(for scale: GPT-2 124M scores about 0.29 HellaSwag acc_norm)",
        flush=True,
    )
    dod = bundle_and_dod(run_dir, ["--spent-usd", "0", "--provider", "local"], postmortem=True)
    print(
        f"\n[demo] act 1 bundle: {run_dir / 'run-bundle'}. DoD exit {dod}: on a CPU demo the val-loss band (a 24 h "
        "A100 run's 3.20-3.50) and the termination screenshot (of a cloud instance) are expected to FAIL; the "
        "other checks should PASS."
    )
    return 0


def act_budget_runs_short(config: Path, data: Path, run_dir: Path, total_steps: int, cap: float = 5.0) -> int:
    """A $5 cap; $0.02 a step until half the planned steps, then $0.04: the money ends before the plan does."""
    print(
        f"\n[demo] act 2: the budget runs short half-way (cap ${cap:.2f}, the price doubles at step "
        f"{total_steps // 3})",
        flush=True,
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    budget = run_dir / "budget.json"
    billing = StepBilling(budget, run_dir / "checkpoints", lambda s: 0.02 if s < total_steps // 3 else 0.04)
    fit = [
        "--set",
        "optim.schedule=wsd",
        "--set",
        "optim.decay_fraction=0.25",
        "--budget-fit",
        "--budget-cap-usd",
        str(cap),
        "--budget-alert-usd",
        str(cap * 0.9),
        "--budget-curr-cost-uri",
        str(budget),
        "--budget-check-every-min",
        "0.02",
        "--budget-reserve-min",
        "0.05",
        "--budget-buffer-usd",
        "0",
        "--budget-expected-step-s",
        "0.2",
        "--force-launch",
    ]
    try:
        code = under_the_watchdog(
            train_cmd(config, data, run_dir, total_steps, *fit), run_dir / "checkpoints", preempt_at=None
        )
    finally:
        billing.close()
    print(
        f"\n[demo] act 2 trained: exit {code}; the simulated bill came to ${billing.spent:.2f} of ${cap:.2f}",
        flush=True,
    )
    if code != 0:
        return code
    dod = bundle_and_dod(
        run_dir,
        ["--budget-curr-cost-uri", str(budget), "--provider", "simulated"],
        postmortem=False,
        dod_extra=("--budget-cap-usd", str(cap)),
    )
    print(
        f"\n[demo] act 2 bundle: {run_dir / 'run-bundle'}. DoD exit {dod}: check 4 reads the fitted run's spend; "
        "the loss band, the post-mortem and the screenshot are not this act's business."
    )
    return 0
