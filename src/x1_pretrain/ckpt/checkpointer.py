"""The loop's checkpointer: a snapshot on the training thread, the write on a background thread
(``checkpoint.async_save``), then pruning; the final checkpoint also becomes ``final.safetensors``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..core.errors import CheckpointFailed
from .checkpoint import (
    FINAL_MODEL,
    FINAL_OPTIM,
    StepSnapshot,
    prune,
    read_latest,
    step_dir_name,
    to_cpu,
    write_final_files,
    write_step_dir,
)


@dataclass(frozen=True)
class CheckpointCalls:
    """What the checkpointer calls: to build a checkpoint's contents, to log, and to tell the run."""

    model_state: Callable[[Any], dict[str, torch.Tensor]]  # raw model -> tensors to save
    trainer_state: Callable[[Any, Any], dict[str, Any]]  # (run, loop state) -> trainer_state.json
    log: Callable[[str], None] = print
    on_saved: Callable[[int, Path, float, int], None] | None = None  # (step, path, seconds, bytes)
    on_final: Callable[[Path, dict[str, str]], None] | None = None  # (step dir, final file hashes)
    before_save: Callable[[], None] | None = None  # e.g. flush the metrics
    on_failed: Callable[[int, str, str, bool], None] | None = None  # (step, reason, what, first of an episode)
    on_recovered: Callable[[int, int], None] | None = None  # (step written, failures in the episode)


class Checkpointer:
    """Writes checkpoints for the loop: snapshot on the training thread, write on a background thread
    (``async_save``), then prune. ``wait`` blocks until the last write is on disk.

    A periodic write that fails (a full disk) is reported at once through ``on_failed`` and training goes on,
    with ``async_save`` or without: the previous complete checkpoint stays ``latest`` and the next one is tried
    on its own schedule (the next ``checkpoint.every_steps`` boundary, or ``checkpoint.every_min`` after the failed
    *attempt*, so a full disk is not retried at every step). ``on_failed`` says whether a failure opens an
    episode (alert once) and ``on_recovered`` when a write succeeds again. A *required* write (the final one, or
    the one a stop asks for) that fails raises :class:`CheckpointFailed`."""

    def __init__(
        self,
        ckpt_dir: Path,
        keep_last: int,
        async_save: bool,
        calls: CheckpointCalls,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dir = ckpt_dir
        self.keep_last = keep_last
        self.async_save = async_save
        self._calls = calls
        self._log = calls.log
        self._clock = clock
        self._thread: threading.Thread | None = None
        self.last_saved_step: int | None = None
        self.last_saved_at = clock()
        self.last_attempt_at = self.last_saved_at  # checkpoint.every_min counts from here (at first: the start)
        self.last_save_s = 0.0
        self.failures = 0  # in this process
        self.failing = 0  # failures since the last write that succeeded (an episode while > 0)

    def minutes_since_attempt(self) -> float:
        return (self._clock() - self.last_attempt_at) / 60

    def due(self, step: int, every_steps: int, every_min: float) -> str | None:
        """Why step ``step`` gets a periodic checkpoint, or None: every ``every_steps`` steps, and with
        ``every_min`` > 0 when that many minutes have passed since the last attempt (written or failed)."""
        if every_steps > 0 and step % every_steps == 0:
            return "periodic"
        if 0 < every_min <= self.minutes_since_attempt():
            return f"periodic, {every_min:g} min since the last"
        return None

    def save(self, run: Any, state: Any, reason: str, required: bool = False) -> None:
        """Checkpoint ``state.step``. ``required``: written now, on this thread, or CheckpointFailed."""
        self.wait()
        final = reason == "final"
        required = required or final
        if self.last_saved_step == state.step:  # e.g. a stop right after a periodic checkpoint
            if final:
                try:
                    self._finish(self.dir / step_dir_name(state.step))
                except Exception as e:
                    self._failed(state.step, reason, e)
                    raise CheckpointFailed(state.step, reason, e) from e
            return
        if self._calls.before_save is not None and not required:
            self._calls.before_save()  # a stop writes its checkpoint first; the metrics follow within the grace
        t0 = self.last_attempt_at = self._clock()
        snap = StepSnapshot(
            state.step,
            to_cpu(self._calls.model_state(run.raw_model)),
            to_cpu(run.optimizer.state_dict()),
            self._calls.trainer_state(run, state),
        )
        snap_s = self._clock() - t0
        if self.async_save and not required:
            self._thread = threading.Thread(
                target=self._write, args=(snap, reason, t0, snap_s, False), name="x1-checkpoint", daemon=False
            )
            self._thread.start()
            return
        error = self._write(snap, reason, t0, snap_s, final)
        if error is not None and required:
            raise CheckpointFailed(snap.step, reason, error)

    def _write(self, snap: StepSnapshot, reason: str, t0: float, snap_s: float, final: bool) -> BaseException | None:
        try:
            path, size = write_step_dir(self.dir, snap)
        except Exception as e:  # reported now; the caller decides whether the run can go on
            self._failed(snap.step, reason, e)
            return e
        secs = self._clock() - t0
        self.last_saved_step = snap.step
        self.last_saved_at = self._clock()
        self.last_save_s = secs
        self._log(
            f"checkpoint {path.name} ({reason}): {size / 1e6:,.1f} MB in {secs:.2f} s "
            f"({size / 1e6 / max(secs, 1e-9):,.0f} MB/s; training paused {snap_s:.2f} s for the snapshot)"
        )
        if self.failing:
            failed, self.failing = self.failing, 0
            self._log(f"checkpoints are written again ({path.name}) after {failed} failed attempt(s)")
            self._report(self._calls.on_recovered, snap.step, failed)
        try:
            if self._calls.on_saved:
                self._calls.on_saved(snap.step, path, secs, size)
            if final:
                self._finish(path)
            prune(self.dir, self.keep_last)
        except Exception as e:
            self._failed(snap.step, reason, e)
            return e
        return None

    def _failed(self, step: int, reason: str, e: BaseException) -> None:
        self.failures += 1
        self.failing += 1
        what = f"{type(e).__name__}: {e}"
        latest = read_latest(self.dir)
        kept = f"{latest} stays the latest complete checkpoint" if latest else "there is no complete checkpoint yet"
        again = "" if self.failing == 1 else f" (failure {self.failing} in a row)"
        self._log(
            f"ERROR: checkpoint {step_dir_name(step)} ({reason}) could not be written to {self.dir}: {what}; "
            f"{kept}{again}. Free space or fix the directory: the next checkpoint is tried on schedule"
        )
        self._report(self._calls.on_failed, step, reason, what, self.failing == 1)

    def _report(self, call: Callable[..., None] | None, *args: Any) -> None:
        if call is None:
            return
        try:
            call(*args)
        except Exception as report_error:  # reporting must not turn one failure into two
            self._log(f"warning: a checkpoint report could not be delivered ({report_error})")

    def _finish(self, path: Path) -> None:
        hashes = write_final_files(self.dir, path)
        self._log(f"final weights: {self.dir / FINAL_MODEL} and {self.dir / FINAL_OPTIM} (from {path.name})")
        if self._calls.on_final:
            self._calls.on_final(path, hashes)

    def wait(self) -> None:
        """Block until the background write (if any) is done; its failure was reported already."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
