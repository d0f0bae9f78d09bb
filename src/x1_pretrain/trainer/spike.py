"""Loss spikes: rare-token batches to provoke one, and a detector that is always on.

Injection (``--inject-spike-at-step N --spike-batches K``): the optimizer steps numbered N .. N+K-1
(numbered as the console and MLflow number them: steps completed) train on synthetic "rare-token"
batches instead of data. Tokens come from the bottom 1% of the train split's unigram distribution
(the token types seen least often), drawn with probability proportional to 1/count so the rarest dominate
and the cross-entropy is high. A batch is a pure function of (seed, step, chunk): a run resumed inside the
window replays the same batches, and the data batches of every other step are unchanged (the injected
steps' data batches are simply not used).

Detection: a step is a spike when its loss is more than ``loss_sigma`` noise units (and at least
``min_loss_jump`` nats) above an exponential moving average of the recent losses, or when its grad norm
(before clipping) exceeds ``grad_factor`` times the median of the recent grad norms. The noise unit is a
moving average of the step-to-step loss change (x 0.886, which makes it a standard deviation for Gaussian
noise): unlike the variance around the moving average, it is not inflated by the fast fall of the loss
early in training. Spike steps do not update the baseline, so a run of bad steps is measured against the
trend before it; after ``grad_window`` flagged steps in a row the new level is accepted as the baseline.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core import names as N
from ..data.tokens import Batch
from .loop import Callback

RARE_FRACTION = 0.01


# --- rare-token batches -----------------------------------------------------------------------------
def unigram_counts(
    data_dir: Path, tokens: np.ndarray, vocab_size: int, cache_dir: Path | None = None, log: Any = print
) -> np.ndarray:
    """The train split's token counts: ``unigram_counts.npy`` from tokenize_data, else computed once from
    ``train.bin`` and cached (in the data dir, or ``cache_dir`` when the data dir is read-only)."""
    for d in (data_dir, cache_dir):
        if d is not None and (d / "unigram_counts.npy").is_file():
            counts = np.load(d / "unigram_counts.npy")
            if counts.shape == (vocab_size,):
                return counts
            log(f"warning: {d / 'unigram_counts.npy'} has shape {counts.shape}, expected ({vocab_size},); recomputing")
    log(f"computing unigram counts of {data_dir / 'train.bin'} ({tokens.size:,} tokens) for rare-token batches")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, tokens.size, 1 << 26):
        counts += np.bincount(np.asarray(tokens[i : i + (1 << 26)]), minlength=vocab_size)[:vocab_size]
    for d in (data_dir, cache_dir):
        if d is None:
            continue
        try:
            tmp = d / f".unigram_counts.npy.tmp-{os.getpid()}"
            with open(tmp, "wb") as f:
                np.save(f, counts)
            os.replace(tmp, d / "unigram_counts.npy")
            break
        except OSError:  # a read-only data dir, a full disk: the next place, with no temp file left behind
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            continue
    return counts


def rare_token_distribution(counts: np.ndarray, eot_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probabilities): the bottom 1% of seen token types, weighted by 1/count."""
    seen = np.flatnonzero(counts > 0)
    if eot_id is not None:
        seen = seen[seen != eot_id]
    if seen.size == 0:
        raise ValueError("the unigram counts are all zero")
    k = max(math.ceil(RARE_FRACTION * counts.size), 1)
    order = seen[np.argsort(counts[seen], kind="stable")]
    ids = order[:k] if order.size >= k else order
    weights = 1.0 / counts[ids].astype(np.float64)
    return ids.astype(np.int64), weights / weights.sum()


@dataclass(frozen=True)
class SpikeSchedule:
    at_step: int  # first injected step, numbered as logged (steps completed after it)
    batches: int  # K consecutive optimizer steps

    def injected(self, step_index: int) -> bool:
        """Whether the optimizer step with 0-based index ``step_index`` (logged as step_index+1) is injected."""
        return self.at_step <= step_index + 1 < self.at_step + self.batches


class SpikeInjector:
    """The loop's BatchSource: replaces the data batches of the injected steps."""

    def __init__(self, schedule: SpikeSchedule, ids: np.ndarray, probs: np.ndarray, seed: int) -> None:
        self.schedule = schedule
        self.ids, self.probs, self.seed = ids, probs, seed
        self.cancelled: str | None = None  # why the injection was skipped (a natural spike came first)

    def active(self, step_index: int) -> bool:
        return self.cancelled is None and self.schedule.injected(step_index)

    def batch(self, step_index: int, chunk: int, rows: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, 0x5B1CE, step_index, chunk])
        tokens = torch.from_numpy(rng.choice(self.ids, size=(rows, seq_len + 1), p=self.probs))
        return tokens[:, :-1], tokens[:, 1:]

    def replace(self, step: int, chunk: int, batch: Any) -> Any:
        if not self.active(step):
            return batch
        x, y = self.batch(step, chunk, batch.x.shape[0], batch.x.shape[1])
        return type(batch)(batch.step, batch.chunk, x, y)


# --- detection --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpikeEvent:
    step: int  # numbered as logged
    loss: float
    baseline: float  # the loss trend before it
    baseline_std: float
    grad_norm: float  # before clipping
    grad_median: float
    clipped: bool
    by: str  # "loss", "grad_norm" or "loss+grad_norm"


@dataclass
class SpikeDetector:
    ema_alpha: float = 0.05
    baseline_steps: int = 20
    loss_sigma: float = 6.0
    min_loss_jump: float = 0.5
    grad_factor: float = 5.0
    grad_window: int = 50
    mean: float | None = None
    noise: float = 0.0  # moving average of |loss change| between accepted steps
    last: float | None = None
    seen: int = 0
    in_a_row: int = 0
    grads: deque[float] = field(default_factory=lambda: deque(maxlen=50))

    def __post_init__(self) -> None:
        self.grads = deque(self.grads, maxlen=self.grad_window)

    def observe(self, step: int, loss: float, grad_norm: float, grad_clip: float) -> SpikeEvent | None:
        """Feed one optimizer step (numbered as logged); returns the event when it is a spike."""
        event = None
        if self.in_a_row >= self.grad_window:  # that long a run of flags is a new level, not a spike
            self.mean, self.last, self.in_a_row = loss, loss, 0
            self.grads.clear()
        elif self.seen >= self.baseline_steps and self.mean is not None:
            std = 0.886 * self.noise
            by_loss = loss > self.mean + max(self.loss_sigma * std, self.min_loss_jump)
            median = float(np.median(self.grads)) if self.grads else float("nan")
            by_grad = bool(self.grads) and grad_norm > self.grad_factor * median
            if by_loss or by_grad:
                event = SpikeEvent(
                    step,
                    loss,
                    self.mean,
                    std,
                    grad_norm,
                    median,
                    grad_clip > 0 and grad_norm > grad_clip,
                    "+".join(n for n, hit in (("loss", by_loss), ("grad_norm", by_grad)) if hit),
                )
        if event is not None:  # spikes do not move the baseline
            self.in_a_row += 1
            return event
        self.in_a_row = 0
        if self.mean is None:
            self.mean = loss
        else:
            self.mean += self.ema_alpha * (loss - self.mean)
        if self.last is not None:
            step_change = abs(loss - self.last)
            self.noise = step_change if self.seen == 1 else self.noise + self.ema_alpha * (step_change - self.noise)
        self.last = loss
        self.grads.append(grad_norm)
        self.seen += 1
        return None

    def state(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "noise": self.noise,
            "last": self.last,
            "seen": self.seen,
            "in_a_row": self.in_a_row,
            "grads": list(self.grads),
        }

    def load_state(self, s: dict[str, Any]) -> None:
        self.mean, self.noise, self.last = s["mean"], s["noise"], s["last"]
        self.seen, self.in_a_row = s["seen"], s["in_a_row"]
        self.grads = deque(s["grads"], maxlen=self.grad_window)


@dataclass(frozen=True)
class SpikeReport:
    """Where SpikeWatch reports: the console, MLflow metrics (step, values) and MLflow tags."""

    log: Callable[[str], None]
    metrics: Callable[[int, dict[str, float]], None]
    tags: Callable[[dict[str, Any]], None]


class SpikeWatch(Callback):
    """The loop's one spike callback: injection (``batch``), detection (``before_update``, which may skip the
    update) and reporting (``after_step``).

    Around a spike the per-step history is logged densely: the last ``HISTORY`` steps before it and every
    step for ``DENSE_AFTER`` steps after, so the post-mortem has a full timeline even with --log-every 10.
    """

    HISTORY = 16  # steps kept before a spike
    DENSE_AFTER = 100  # steps logged densely after one

    def __init__(
        self,
        detector: SpikeDetector,
        injector: SpikeInjector | None,
        skip_updates: bool,
        force_inject: bool,
        report: SpikeReport,
        lr_warmup_steps: int = 0,
    ) -> None:
        self.detector = detector
        self.lr_warmup_steps = lr_warmup_steps  # the optimizer's LR warm-up: detections inside it never cancel
        self.injector = injector
        self.skip_updates = skip_updates
        self.force_inject = force_inject
        self._log, self._metrics, self._tags = report.log, report.metrics, report.tags
        self._ring: deque[tuple[int, dict[str, float]]] = deque(maxlen=self.HISTORY)
        self._dense_until = -1
        self._dense_after = self.DENSE_AFTER
        self._event: SpikeEvent | None = None
        self._skipped = False

    def batch(self, step: int, chunk: int, batch: Batch) -> Batch:
        """The rare-token batch in place of the data on the injected steps."""
        return self.injector.replace(step, chunk, batch) if self.injector is not None else batch

    def before_update(self, step: int, loss: float, grad_norm: float, grad_clip: float) -> bool:
        """Returns True when the optimizer update of this step must be skipped."""
        return self.observe(step, loss, grad_norm, grad_clip)

    def observe(self, step_index: int, loss: float, grad_norm: float, grad_clip: float) -> bool:
        self._event = self.detector.observe(step_index + 1, loss, grad_norm, grad_clip)
        self._skipped = self._event is not None and self.skip_updates
        return self._skipped

    def after_step(self, run: Any, state: Any, report: Any) -> None:
        step, metrics = state.step, report.metrics
        basic: dict[str, float] = {k: metrics[k] for k in (N.TRAIN_LOSS, N.TRAIN_GRAD_NORM, N.TRAIN_LR) if k in metrics}
        extra: dict[str, float] = {}
        inj = self.injector
        injected = inj is not None and inj.active(step - 1)
        if inj is not None and injected and step == inj.schedule.at_step:
            last = inj.schedule.at_step + inj.schedule.batches - 1
            self._log(f"spike injection: steps {step}..{last} train on rare-token batches")
            self._start_dense(step)
        if injected:
            extra[N.SPIKE_INJECTED] = 1.0
        ev = self._event
        if ev is not None:
            extra.update(
                {
                    N.SPIKE_DETECTED: 1.0,
                    N.SPIKE_LOSS: ev.loss,
                    N.SPIKE_BASELINE_LOSS: ev.baseline,
                    N.SPIKE_GRAD_NORM: ev.grad_norm,
                    N.SPIKE_CLIPPED: float(ev.clipped),
                    N.SPIKE_UPDATE_SKIPPED: float(self._skipped),
                }
            )
            self._log(
                f"spike detected at step {ev.step} ({ev.by}): loss {ev.loss:.4f} vs baseline {ev.baseline:.4f} "
                f"(std {ev.baseline_std:.4f}), grad norm {ev.grad_norm:.3f} vs median {ev.grad_median:.3f}, "
                f"clipping {'active' if ev.clipped else 'not active'}"
                + ("; optimizer update skipped (--spike-skip-steps)" if self._skipped else "")
            )
            self._start_dense(step)
            if (
                inj is not None
                and inj.cancelled is None
                and not injected
                and step < inj.schedule.at_step
                and not self.force_inject
            ):
                self._maybe_cancel(inj, ev)
        if inj is not None and injected and step == inj.schedule.at_step + inj.schedule.batches - 1:
            self._log(f"spike injection: done after step {step}; back to the data")
        self._ring.append((step, basic))
        if step <= self._dense_until or extra:
            self._metrics(step, {**basic, **extra})
        return None

    def _maybe_cancel(self, inj: SpikeInjector, ev: SpikeEvent) -> None:
        """Only a natural *loss* spike after the LR warm-up replaces the planned injection: a grad-norm blip
        alone, or anything during warm-up (where large gradients are normal), is no spike to write up."""
        step = ev.step
        if "loss" not in ev.by or step <= self.lr_warmup_steps:
            why = "grad norm only" if "loss" not in ev.by else f"during the LR warm-up (step <= {self.lr_warmup_steps})"
            self._log(
                f"spike injection kept: the detection at step {step} is {why}; the injection at step "
                f"{inj.schedule.at_step} goes ahead"
            )
            return
        inj.cancelled = f"natural loss spike at step {step} before step {inj.schedule.at_step}"
        self._log(
            f"spike injection skipped: a natural loss spike came first (step {step}, after the warm-up); "
            "write its post-mortem instead (--force-inject injects anyway)"
        )
        self._tags({N.TAG_SPIKE_INJECTION_SKIPPED: inj.cancelled})

    def _start_dense(self, step: int) -> None:
        for s, m in self._ring:  # the steps just before, which --log-every may have skipped
            if s < step:
                self._metrics(s, m)
        self._ring.clear()
        self._dense_until = max(self._dense_until, step + self._dense_after)

    def state(self) -> dict[str, Any]:
        return {
            "detector": self.detector.state(),
            "dense_until": self._dense_until,
            "injection_cancelled": self.injector.cancelled if self.injector else None,
        }

    def load_state(self, s: dict[str, Any]) -> None:
        self.detector.load_state(s["detector"])
        self._dense_until = int(s.get("dense_until", -1))
        if self.injector is not None:
            self.injector.cancelled = s.get("injection_cancelled")
