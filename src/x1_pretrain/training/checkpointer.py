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

from ..core.errors import X1Error
from .checkpoint import (
    FINAL_MODEL,
    FINAL_OPTIM,
    Snapshot,
    prune,
    step_dir_name,
    to_cpu,
    write_final_files,
    write_step_dir,
)


@dataclass(frozen=True)
class CheckpointCalls:
    """What the checkpointer calls: to build a checkpoint's contents, to log, and to tell the run."""

    model_state: Callable[[Any], dict[str, torch.Tensor]]       # raw model -> tensors to save
    trainer_state: Callable[[Any, Any], dict[str, Any]]         # (run, loop state) -> trainer_state.json
    log: Callable[[str], None] = print
    on_saved: Callable[[int, Path, float, int], None] | None = None    # (step, path, seconds, bytes)
    on_final: Callable[[Path, dict[str, str]], None] | None = None     # (step dir, final file hashes)
    before_save: Callable[[], None] | None = None                      # e.g. flush the metrics


class Checkpointer:
    """Writes checkpoints for the loop: snapshot on the training thread, write on a background thread
    (``async_save``), then prune. ``wait`` blocks until the last write is on disk."""

    def __init__(self, ckpt_dir: Path, keep_last: int, async_save: bool, calls: CheckpointCalls) -> None:
        self.dir = ckpt_dir
        self.keep_last = keep_last
        self.async_save = async_save
        self._model_state = calls.model_state
        self._trainer_state = calls.trainer_state
        self._log = calls.log
        self._on_saved = calls.on_saved
        self._on_final = calls.on_final
        self._before_save = calls.before_save
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_saved_step: int | None = None
        self.last_save_s = 0.0

    def save(self, run: Any, state: Any, reason: str) -> None:
        self.wait()
        final = reason == "final"
        if self.last_saved_step == state.step:  # e.g. a stop right after a periodic checkpoint
            if final:
                self._finish(self.dir / step_dir_name(state.step))
            return
        if self._before_save is not None:
            self._before_save()
        t0 = time.monotonic()
        snap = Snapshot(state.step, to_cpu(self._model_state(run.raw_model)), to_cpu(run.optimizer.state_dict()),
                        self._trainer_state(run, state))
        snap_s = time.monotonic() - t0
        if self.async_save and not final:
            self._thread = threading.Thread(target=self._write, args=(snap, reason, t0, snap_s, False),
                                            name="x1-checkpoint", daemon=False)
            self._thread.start()
        else:
            self._write(snap, reason, t0, snap_s, final)
            self._raise_if_failed()

    def _write(self, snap: Snapshot, reason: str, t0: float, snap_s: float, final: bool) -> None:
        try:
            path, size = write_step_dir(self.dir, snap)
            secs = time.monotonic() - t0
            self.last_saved_step = snap.step
            self.last_save_s = secs
            self._log(f"checkpoint {path.name} ({reason}): {size / 1e6:,.1f} MB in {secs:.2f} s "
                      f"({size / 1e6 / max(secs, 1e-9):,.0f} MB/s; training paused {snap_s:.2f} s for the snapshot)")
            if self._on_saved:
                self._on_saved(snap.step, path, secs, size)
            if final:
                self._finish(path)
            prune(self.dir, self.keep_last)
        except BaseException as e:
            self._error = e

    def _finish(self, path: Path) -> None:
        hashes = write_final_files(self.dir, path)
        self._log(f"final weights: {self.dir / FINAL_MODEL} and {self.dir / FINAL_OPTIM} (from {path.name})")
        if self._on_final:
            self._on_final(path, hashes)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, OSError):
                raise X1Error(f"checkpoint could not be written to {self.dir}: {err}") from err
            raise err

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_if_failed()
