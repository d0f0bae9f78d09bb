"""One trainer process from options to exit code: config → device → launch gate → signals → build → loop.

Exit codes: the table ``core.contract.EXIT_CODES`` (``train --help`` prints it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..budget import alerts, ledger
from ..budget import gate as bg
from ..budget.guard import STALE_AFTER_INTERVALS, Limits
from ..budget.money import Lines
from ..budget.source import read_source
from ..ckpt import checkpoint as ck
from ..core import config as C
from ..core import contract
from ..core import names as N
from ..core.config import BudgetConfig
from ..core.contract import (
    EXIT_ABORTED,
    EXIT_BUDGET_CHECKPOINT,
    EXIT_BUDGET_NOW,
    EXIT_CHECKPOINT_FAILED,
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNEXPECTED,
    EXIT_USAGE,
)
from ..core.errors import CheckpointFailed, RankLost, X1Error
from ..core.fileio import disk_full
from ..core.log import Log, as_log
from ..core.names import EXPERIMENT
from ..model import flops
from ..supervise.lock import RunLock
from ..supervise.signals import StopDeadline, install_signal_handlers, watch_parent
from ..trainer import distributed
from ..trainer.budget_control import BudgetSetup, stop_message
from ..trainer.device import resolve_device
from ..trainer.loop import Diverged, StopFlag, train_loop
from .build import Built, Context, build_run, start_batches
from .options import TrainOptions, eval_cost, warn_visible_secrets
from .run_record import tag_final

_log = logging.getLogger(__name__)


console = as_log(_log)  # rank 0's lines


def _quiet(msg: str) -> None:
    return None


def budget_limits(opts: TrainOptions, b: BudgetConfig) -> Limits | None:
    """The guard's limits from the config's budget section (flags set its keys), or None when no cap is set.
    The section's own rules were checked when the config loaded; what is left is the flags' combination."""
    if b.cap_usd is None:
        if opts.dry_run_budget:
            raise X1Error(
                "--dry-run-budget needs a cap (--budget-cap-usd, or budget.cap_usd in the config) and "
                "--budget-curr-cost-uri"
            )
        return None
    if not opts.curr_cost_uri:
        raise X1Error(
            f"budget.cap_usd {b.cap_usd:g} (--budget-cap-usd) needs --budget-curr-cost-uri: the budget.json "
            "the sidecar writes (python -m x1_pretrain.budget_sidecar --out budget.json ...); or run "
            "without the guard: --set budget.cap_usd=null"
        )
    return Limits(
        cap_usd=b.cap_usd,
        alert_usd=b.alert_usd,
        sidecar_interval_min=b.sidecar_interval_min,
        stale_after_intervals=STALE_AFTER_INTERVALS,
        unknown_grace_min=b.unknown_grace_min,
        lines=Lines(buffer_usd=b.buffer_usd),
        reserve_min=b.reserve_min,
    )


def _launch_gate(
    opts: TrainOptions, cfg: C.Config, setup: BudgetSetup, peak: float | None, log: Log
) -> tuple[int, str] | None:
    """The dry run, or the gate before anything is built: (exit code, why) to stop with, or None to go on."""
    b = cfg.budget
    latest = ck.read_latest(opts.ckpt_dir) if opts.resume else None
    done = int(latest.split("_")[1]) if latest and latest.startswith("step_") else 0
    step_s = bg.expected_step_s(
        b.expected_step_s, cfg.tokens_per_step(), flops.flops_per_token(cfg.model).honest, peak, b.assumed_mfu
    )
    # the task evaluations as plan prices them: their share of each step, and the last one in the reserve
    evals = eval_cost(cfg)
    limits = dataclasses.replace(setup.limits, reserve_min=setup.limits.reserve_min + evals.final_s(step_s or 0.0) / 60)
    if step_s is not None:
        step_s += evals.per_step_s(step_s)
    plan = bg.LaunchPlan(total_steps=cfg.train.total_steps, steps_done=done, step_s=step_s, resumed=done > 0, fit=b.fit)
    if opts.dry_run_budget:
        # the dry run's report is the command's result, not a log line: printed whatever --log-level says
        return bg.dry_run(setup.curr_cost_uri, limits, plan, b.max_rate_usd_per_hr, setup.alerter, print), "dry run"
    if not setup.alerter.channels():
        log(
            "WARNING: the budget guard is on but NO ALERT CHANNEL is configured: budget stops, a falling or unknown "
            "spend and the alert line will reach nobody. Set X1_SLACK_WEBHOOK_URL and/or X1_SMTP_HOST + X1_SMTP_TO "
            "(README: alerts) and check them with --dry-run-budget"
        )
    reading = bg.as_the_guard_sees_it(read_source(setup.curr_cost_uri), limits, ledger.read_memory(opts.ckpt_dir))
    problems = bg.gate_problems(reading, plan, limits, b.max_rate_usd_per_hr)
    if problems and not opts.force_launch:
        for problem in problems:
            _log.error(f"launch refused: {problem}")
        spent = reading.snapshot.spent_usd if reading.snapshot else None
        why = "launch refused: " + "; ".join(problems)
        subject, body = stop_message(EXIT_BUDGET_CHECKPOINT, why, limits.cap_usd, spent, None)
        setup.alerter.send_within(subject, body)
        return EXIT_BUDGET_CHECKPOINT, why
    for problem in problems:
        log(f"warning: --force-launch given despite: {problem}")
    expect = bg.expectation(reading, plan, limits) if plan.fit else None
    if expect:
        log(expect)
    if step_s is None:
        log("warning: the planned cost cannot be checked (no --budget-expected-step-s and no known GPU peak)")
    return None


def end_at_last_checkpoint(
    ckpt_dir: Path,
    mlflow_uri: str | None,
    why: str,
    log: Log,
    experiment: str | None = None,
    exit_code: int = EXIT_BUDGET_CHECKPOINT,
) -> bool:
    """End a run where it stands, like a budget stop mid-run: the final files from the newest complete
    checkpoint, and its MLflow run FINISHED with ``why`` (so export_run works). Used for a launch refused on a
    resumed run and by the watchdog before it terminates a crash-looped run. False when there is no checkpoint."""
    found = ck.find_latest_complete(ckpt_dir, log)
    if found is None:
        return False
    lock = RunLock(ckpt_dir, log)
    lock.acquire()
    try:
        hashes = ck.write_final_files(ckpt_dir, found.path)
        log(f"the run ends at its last checkpoint {found.path.name}: final weights {ckpt_dir / ck.FINAL_MODEL}")
        run_id = found.state.get("mlflow_run_id")
        if not run_id:
            return True
        from ..trainer.tracking import MlflowTracker, resolve_uri

        uri, _ = resolve_uri(mlflow_uri, ckpt_dir)
        tracker = MlflowTracker(uri, None, "", run_id=str(run_id), experiment=experiment or EXPERIMENT)
        tag_final(tracker, ckpt_dir, found.path, hashes)
        tracker.set_tags({N.TAG_END_REASON: why[:4000], N.TAG_EXIT_CODE: exit_code})
        tracker.close("FINISHED", timeout_s=20.0, spill_dir=ckpt_dir)
    except (OSError, ValueError) as e:
        _log.warning(
            f"the final files could not be written from {found.path} ({e}); export_run --ckpt-dir "
            f"{ckpt_dir} still finds the checkpoint"
        )
    finally:
        lock.release()
    return True


def train(opts: TrainOptions) -> int:
    """Train under ``opts``; returns the exit code (X1Error and KeyboardInterrupt propagate)."""
    from ..core.env import device_name, keep_freed_memory

    started_unix = time.time()
    world = distributed.world_from_env()
    cfg = C.load(opts.config, opts.overrides, list(opts.sets), world_size=world.size, vocab=C.data_vocab(opts.data_dir))
    log: Log = console if world.main else _quiet  # ranks other than 0 train quietly; errors still reach stderr
    if world.size > 1:
        log(
            f"data parallel over {world.size} ranks: global batch {cfg.train.batch_size} = micro-batch "
            f"{cfg.train.micro_batch_size} x grad accumulation {cfg.train.grad_accum_steps // world.size} x "
            f"{world.size} ranks"
        )
    import numpy as np  # noqa: F401  (imported before torch on purpose: fail fast on a broken env)

    if world.main and cfg.train.eval_tasks.strip():
        from ..evals.registry import task_list

        task_list(cfg.train.eval_tasks)  # an unknown task: exit 2 before anything is built
    limits = budget_limits(opts, cfg.budget)
    setup = (
        BudgetSetup(cfg.budget, str(opts.curr_cost_uri), limits, alerts.from_env(), opts.force_launch)
        if limits is not None
        else None
    )
    sp = opts.spike
    if sp.inject_at_step is not None and (sp.inject_at_step < 1 or sp.batches < 1):
        raise X1Error(f"--inject-spike-at-step {sp.inject_at_step} and --spike-batches {sp.batches} must be at least 1")
    device = resolve_device(cfg.train.device, world.local_rank, world.size)
    if device.type == "cpu":
        keep_freed_memory()  # large CPU tensors would otherwise be page-faulted in again at every step
    peak = flops.peak_tflops(device_name(device) if device.type == "cuda" else None, opts.peak_tflops)
    if not opts.stop_grace_s > 0:
        raise X1Error(f"--stop-grace-s {opts.stop_grace_s} must be positive (seconds from SIGTERM to exit)")
    remote = open_remote(opts, cfg, world, log)  # before the gate: the ledger it reads may come from the remote
    distributed.init(world, device.type)
    if setup is not None:
        stop = _gate_on_rank0(opts, cfg, setup, peak, _Where(world, device, started_unix), log)
        if stop is not None:
            return stop[0]
    lock = RunLock(opts.ckpt_dir, log) if world.main else None
    if lock is not None:
        lock.acquire()  # before anything is written: a second trainer on this dir exits 2 naming the holder
    try:
        return _train_locked(opts, cfg, _Where(world, device, started_unix, remote), log, setup)
    except Exception as e:
        if world.size > 1 and not isinstance(e, X1Error) and distributed.peer_lost(e):
            raise rank_lost(e, None) from None
        raise
    finally:
        if lock is not None:
            lock.release()


def _gate_on_rank0(
    opts: TrainOptions, cfg: C.Config, setup: BudgetSetup, peak: float | None, where: _Where, log: Log
) -> tuple[int, str] | None:
    """The launch gate, read by rank 0 alone (the other machines of a multi-node job have no budget.json), its
    verdict agreed by every rank. The planned step time is over every rank's GPU."""
    world = where.world
    stop = _launch_gate(opts, cfg, setup, peak * world.size if peak else None, log) if world.main else None
    if stop is not None and stop[0] == EXIT_BUDGET_CHECKPOINT and not opts.dry_run_budget and opts.resume:
        end_at_last_checkpoint(opts.ckpt_dir, opts.mlflow_uri, stop[1], log, opts.experiment)  # before any rank leaves
    if world.size > 1:
        code, stopped = distributed.agree_max([stop[0] if stop else 0, int(stop is not None)], world, where.device)
        if stopped:
            stop = stop or (code, "rank 0's launch gate stopped the run")
            _node_status(world, stop[0], stop[1])
            distributed.shutdown(world)
    return stop


def _node_status(world: Any, code: int, reason: str) -> None:
    """Another node's first process records rank 0's code for its node's watchdog now, before any rank leaves:
    torchrun ends a node's other workers once one has exited, and a code recorded late could be lost."""
    if world.size > 1 and world.local_rank == 0 and not world.main:
        contract.record_exit_status(None, code, reason)


@dataclass(frozen=True)
class _Where:
    """Where this process trains: its rank and device, and when it started."""

    world: Any
    device: Any
    started_unix: float
    remote: Any = None  # ckpt.objstore.Store with --ckpt-remote


def open_remote(opts: TrainOptions, cfg: C.Config, world: Any, log: Log) -> Any:
    """The ``checkpoint.remote`` store (None without one): credentials and bucket checked now (exit 2 naming the
    fix), a store that cannot be reached is a warning; a prefix another run owns is refused (``run_owner``: a
    fresh run's own id claims it, a resume on an empty disk continues its owner's run only with
    ``X1_RUN_ID=<owner>``); a resume brings the remote's
    newest complete checkpoint, ledger and MLflow copy down first (with nothing local, waiting up to
    checkpoint.remote_wait_min for a store that cannot be reached: then exit 8)."""
    if not cfg.checkpoint.remote:
        return None
    from ..ckpt import run_owner
    from ..ckpt.mirror import mlflow_store
    from ..ckpt.objstore import RemoteURL, Store, launch_check
    from ..ckpt.remote_resume import PULL_WAIT_S, pull_when_reachable, pulled_marker, wait_for_pull

    store = Store(RemoteURL.parse(cfg.checkpoint.remote, "checkpoint.remote (--ckpt-remote)"))
    if world.local_rank != 0:  # one process a node checks and pulls; the others wait for it (below)
        if opts.resume and not opts.dry_run_budget:
            wait_for_pull(opts.ckpt_dir, log, PULL_WAIT_S + cfg.checkpoint.remote_wait_min * 60)
        return store
    reachable = launch_check(store, log)
    if world.main and not opts.dry_run_budget:  # whose prefix it is: another run's is exit 2 (run_owner)
        run_owner.at_launch(store, opts.ckpt_dir, opts.resume, reachable, log)
    if opts.resume and not opts.dry_run_budget:
        with pulled_marker(opts.ckpt_dir, world.size > 1):
            pull_when_reachable(
                store, opts.ckpt_dir, log, mlflow_store(opts.mlflow_uri, opts.ckpt_dir), cfg.checkpoint.remote_wait_min
            )
    return store


MIRROR_END_WAIT_S = 300.0  # a run that ends without a stop request waits this long for its last uploads


def _start_mirror(opts: TrainOptions, cfg: C.Config, store: Any, log: Log, setup: BudgetSetup | None) -> Any:
    from ..ckpt.mirror import Mirror, mlflow_store

    alerter = setup.alerter if setup is not None else alerts.from_env()
    send = (lambda subject, body: alerter.send_within(subject, body)) if alerter.channels() else None
    db = mlflow_store(opts.mlflow_uri, opts.ckpt_dir)
    log(
        f"mirror: checkpoints, the cost ledger, the exit status{' and the MLflow store' if db else ''} go to "
        f"{store.url} at {store.endpoint()}"
        + ("" if db else " (the MLflow tracking server is not mirrored: it outlives this machine)")
    )
    mirror = Mirror(store, opts.ckpt_dir, cfg.checkpoint.keep_last, log, send, upload_process=True)
    mirror.resume = opts.resume  # a resume may claim a prefix of ownerless checkpoints (run_owner.legacy_refusal)
    return mirror.start()


def _end_mirror(ctx: Context, code: int) -> int:
    """The last uploads: the exit status, the ledger and the MLflow copy after the final (or stop) checkpoint,
    within what is left of --stop-grace-s after a stop, else within MIRROR_END_WAIT_S; says what did not make it.
    Returns the exit code: a run that finished before its mirror found the prefix another run's is exit 2 (so
    nothing after it, an export or --terminate-on-exit, takes it for a run whose prefix it owns)."""
    mirror = ctx.mirror
    contract.record_exit_status(ctx.ckpt_dir, code, "see the log")
    for name in (ledger.LEDGER_FILE, contract.EXIT_STATUS):
        mirror.file(name)
    if ctx.mlflow_store is not None:
        mirror.mlflow(ctx.mlflow_store)
    left = ctx.deadline.remaining() if ctx.deadline is not None else None
    budget_s = MIRROR_END_WAIT_S if left is None else max(left - 1.0, 0.0)
    t0 = time.monotonic()
    # a normal end keeps trying through a few failures (the VM may be torn down after it); a stop has its grace
    if mirror.drain(budget_s, failures=3 if left is None else 1):
        if getattr(mirror, "refused", None):  # another run's prefix (run_owner): said at the time, said again
            ctx.log(f"WARNING: nothing of this run went to {mirror.store.url}: it belongs to run {mirror.refused}")
            if code != EXIT_OK:
                return code
            _log.error(mirror.refusal)
            contract.record_exit_status(ctx.ckpt_dir, EXIT_USAGE, str(mirror.refusal)[:2000])
            return EXIT_USAGE
        ctx.log(
            f"mirror: {mirror.store.url} is up to date (latest {mirror.remote_latest or 'unchanged'}; "
            f"{mirror.uploaded_bytes / 1e6:,.1f} MB in {mirror.upload_s:.1f} s of uploads this process)"
        )
        return code
    local = ck.read_latest(ctx.ckpt_dir)
    ctx.log(
        f"WARNING: the mirror could not upload {', '.join(mirror.pending())} within {time.monotonic() - t0:.0f} s"
        + (f" ({mirror.last_error})" if mirror.last_error else "")
        + f": the remote's latest is "
        f"{mirror.remote_latest or 'as before this process'}, the local one {local or 'none'}; a resume on this "
        "machine uses the local checkpoint, one on another machine the remote's"
    )
    return code


def _train_locked(opts: TrainOptions, cfg: C.Config, where: _Where, log: Log, setup: BudgetSetup | None) -> int:
    world, device = where.world, where.device
    stop = StopFlag()
    restore_signals = install_signal_handlers(stop)
    parent = watch_parent(stop)
    expiry = _OutOfGrace(opts, stop, world.main)
    deadline = StopDeadline(stop, opts.stop_grace_s, expiry).start()
    distributed.init(world, device.type)
    mirror = _start_mirror(opts, cfg, where.remote, log, setup) if where.remote is not None and world.main else None
    try:
        from ..ckpt.mirror import mlflow_store

        ctx = Context(
            cfg,
            opts,
            world,
            device,
            log,
            stop,
            where.started_unix,
            setup if world.main else None,
            deadline=deadline,
            on_built=expiry.built.append,
            mirror=mirror,
            mlflow_store=mlflow_store(opts.mlflow_uri, opts.ckpt_dir),
        )
        code = run_training(ctx, cap_set=setup is not None)
        if mirror is not None:
            code = _end_mirror(ctx, code)
        if world.size > 1:
            # Ranks leave together once rank 0 has written its last checkpoint and its exit status: a rank
            # that left early with a non-zero code would make torchrun signal rank 0 mid-write.
            import torch

            if world.main:
                contract.write_exit_status(opts.ckpt_dir, code, "see the log")
            code = int(distributed.from_rank(code, world))  # every node's watchdog acts on the run's outcome
            _node_status(world, code, "rank 0's exit code")
            torch.distributed.barrier()
        return code
    finally:
        if mirror is not None:
            mirror.close()
        deadline.close()
        if parent is not None:
            parent.set()
        restore_signals()
        distributed.shutdown(world)


class _OutOfGrace:
    """What the stop deadline does when ``--stop-grace-s`` has passed since the stop request: record the exit
    status and end the process. 75 when the stop's checkpoint is on disk (only MLflow was late), else 7."""

    def __init__(self, opts: TrainOptions, stop: StopFlag, main: bool) -> None:
        self.opts, self.stop, self.main = opts, stop, main
        self.built: list[Built] = []
        self._exit = os._exit  # replaced in tests that must not end the test process

    def checkpointed(self) -> bool:
        if not self.built or self.built[0].checkpointer is None:
            return True  # nothing built yet (nothing new to save), or a rank other than 0 (rank 0 saves)
        chk, step = self.built[0].checkpointer, self.built[0].state.step
        return chk.last_saved_step == step or chk.last_saved_at >= (self.stop.requested_at or float("inf"))

    def __call__(self) -> None:
        saved = self.checkpointed()
        code = EXIT_INTERRUPTED if saved else EXIT_CHECKPOINT_FAILED
        reason = f"--stop-grace-s {self.opts.stop_grace_s:g} passed since {self.stop.requested}: " + (
            "the checkpoint is written; exiting before MLflow finished (its metrics are in the spill file "
            "or sent again on resume)"
            if saved
            else "no checkpoint of the last steps could be written "
            "in time; the previous complete checkpoint stays the latest"
        )
        _log.warning(f"{reason}: exit {code}")
        if self.main:
            contract.record_exit_status(self.opts.ckpt_dir, code, reason)
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(code)


def _first_check(ctx: Context, built: Built, cap_set: bool) -> tuple[int, str, float | None]:
    """The budget check before the first step: (exit code or 0, reason, spend). Every rank learns rank 0's
    verdict, or the others would wait for it forever."""
    code, reason, spent = 0, "", None
    if built.guard is not None:
        built.guard.monitor.note_step(built.state.step, built.run.end_step, 0.0)
        code, reason, spent = built.guard.first_check()
        if code:
            ctx.log(f"warning: {reason} (before training; exit {code})")
        elif built.guard.proposed_end:
            built.run.proposed_end, built.guard.proposed_end = built.guard.proposed_end, 0
    if cap_set:
        (code,) = distributed.agree_max([code], ctx.world, ctx.device)
    return code, reason, spent


def _stop_before_training(ctx: Context, built: Built, code: int, reason: str, spent: float | None) -> int:
    status, written = "KILLED", None
    found = built.resume.found
    if code == EXIT_BUDGET_CHECKPOINT and found is not None and ctx.world.main:
        # the run ends at its last checkpoint
        tag_final(built.tracker, ctx.ckpt_dir, found.path, ck.write_final_files(ctx.ckpt_dir, found.path))
        status, written = "FINISHED", str(found.path)
    if built.guard is not None:
        built.guard.alert_stop(code, reason, spent, written)
    built.tracker.close(status, spill_dir=ctx.ckpt_dir)
    return code


def run_training(ctx: Context, cap_set: bool) -> int:
    built = build_run(ctx)
    first_code, reason, spent = _first_check(ctx, built, cap_set)
    if first_code:  # stop before training: nothing new to checkpoint
        return _stop_before_training(ctx, built, first_code, reason, spent)
    if built.guard is not None:
        built.guard.watcher.start()
    start_batches(built)
    if ctx.on_built is not None:
        ctx.on_built(built)
    status = "FAILED"
    try:
        outcome = train_loop(built.run, built.state)
        # A budget stop with a checkpoint is a planned end of the run (and what export_run exports).
        status = "FINISHED" if outcome.exit_code in (0, EXIT_BUDGET_CHECKPOINT) else "KILLED"
        built.tracker.set_tags({N.TAG_END_REASON: outcome.reason[:4000], N.TAG_EXIT_CODE: outcome.exit_code})
        ended = f"{outcome.reason} at step {outcome.step}: exit {outcome.exit_code}"
        ctx.log(ended if outcome.exit_code == 0 else f"warning: {ended}")  # a stop says why at any level
        if built.guard is not None and outcome.exit_code in (EXIT_BUDGET_CHECKPOINT, EXIT_BUDGET_NOW):
            last = built.guard.monitor.last
            written = (
                str(ctx.ckpt_dir / ck.step_dir_name(outcome.step))
                if outcome.exit_code == EXIT_BUDGET_CHECKPOINT
                else None
            )
            built.guard.alert_stop(outcome.exit_code, outcome.reason, last.spent_usd if last else None, written)
        return outcome.exit_code
    except Diverged as e:
        built.tracker.set_tags({N.TAG_DIVERGED_AT_STEP: e.step})
        _log.error(
            f"{e}. No checkpoint was written from these weights. Check the data for out-of-range ids "
            "and that fp32 master weights are on (train.precision bf16 keeps them); lower optim.lr if it "
            "persists."
        )
        return EXIT_DIVERGED
    except CheckpointFailed as e:
        return _checkpoint_failed(ctx, built, e)
    except (X1Error, KeyboardInterrupt):
        raise
    except Exception as e:
        if ctx.world.size > 1 and distributed.peer_lost(e):
            lost = rank_lost(e, built.state.step)
            built.tracker.set_tags({N.TAG_END_REASON: str(lost)[:4000], N.TAG_EXIT_CODE: EXIT_UNEXPECTED})
            raise lost from None
        if disk_full(e):  # a write this process cannot skip: the same end as a checkpoint that cannot be written
            return _checkpoint_failed(ctx, built, CheckpointFailed(built.state.step, "next", e))
        traceback.print_exc()
        return EXIT_UNEXPECTED
    finally:
        _close(ctx, built, status)


def rank_lost(e: BaseException, step: int | None) -> RankLost:
    """A collective that failed on a lost peer, as one line (exit 1); the backend's own words (NCCL's "Last
    error" lines) go to the log as its traceback."""
    traceback.print_exc()
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return RankLost(
        f"another rank stopped answering{f' at step {step}' if step is not None else ''} ({first}): its "
        "process died, or its machine was lost, preempted or stopped. Exit 1: the watchdog of each node "
        "relaunches, torchrun waits for every node to join again and the run resumes from the newest "
        "checkpoint any node holds"
    )


def _checkpoint_failed(ctx: Context, built: Built, e: CheckpointFailed) -> int:
    """The checkpoint the run had to end with is not on disk (it was reported when it failed)."""
    latest = ck.read_latest(ctx.ckpt_dir)
    msg = (
        f"{e}. Exit {EXIT_CHECKPOINT_FAILED}: the watchdog relaunches from the last complete checkpoint "
        f"({latest or 'none yet'}) once the disk of {ctx.ckpt_dir} has room"
    )
    _log.error(msg)
    built.tracker.set_tags({N.TAG_END_REASON: msg[:4000], N.TAG_EXIT_CODE: EXIT_CHECKPOINT_FAILED})
    return EXIT_CHECKPOINT_FAILED


def _close(ctx: Context, built: Built, status: str) -> None:
    """Close everything; after a stop request, within what is left of --stop-grace-s (MLflow gets the rest)."""
    if built.guard is not None:
        built.guard.close()
    if built.prefetch is not None:
        built.prefetch.close()
    try:
        if built.checkpointer is not None:
            built.checkpointer.wait()
        left = ctx.deadline.remaining() if ctx.deadline is not None else None
        if ctx.mirror is not None and left is not None:
            ctx.mirror.drain(left * 0.6)  # after a stop: the stop checkpoint goes up before MLflow is closed
    finally:
        left = ctx.deadline.remaining() if ctx.deadline is not None else None
        built.tracker.close(status, timeout_s=None if left is None else max(left - 1.5, 0.5), spill_dir=ctx.ckpt_dir)


def main_guarded(opts: TrainOptions) -> tuple[int, str]:
    """(exit code, one-line reason) for ``opts``: user mistakes and a second Ctrl-C become codes too."""
    warn_visible_secrets(opts)
    try:
        return train(opts), "see the log"
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code, str(e).splitlines()[0]
    except KeyboardInterrupt:
        _log.error("aborted by a second SIGINT: no checkpoint written for the current step")
        return EXIT_ABORTED, "aborted by a second SIGINT"
    except OSError as e:
        if not disk_full(e):
            raise
        latest = ck.read_latest(opts.ckpt_dir)
        reason = f"the disk of {opts.ckpt_dir} is full ({e}); " + (
            f"{latest} stays the latest complete checkpoint" if latest else "no checkpoint was written"
        )
        _log.error(f"{reason}. Exit {EXIT_CHECKPOINT_FAILED}: the watchdog waits for free space, then relaunches")
        return EXIT_CHECKPOINT_FAILED, reason
