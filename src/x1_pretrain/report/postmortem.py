"""The spike post-mortem draft: find the spike in a run's metrics (injected, flagged, or re-detected),
measure it against the trend before it, and write the Markdown and ``spike.png`` (``postmortem.py`` is
the command)."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import names as N
from ..core import redact
from ..core.config import SpikeConfig
from ..core.errors import X1Error
from ..core.fileio import write_text_atomic
from ..trainer.spike import SpikeDetector
from . import runs

BEFORE = 20  # steps before the spike whose logged losses make its baseline trend
SHOW_BEFORE = 5  # rows of the timeline before the spike


@dataclass(frozen=True)
class Spike:
    kind: str  # "injected" or "natural"
    source: str  # how it was found
    first: int
    last: int
    steps: tuple[int, ...]


def _series(points: list[runs.MetricPoint], name: str) -> dict[int, float]:
    return {p.step: p.value for p in points if p.name == name}


def _clusters(steps: list[int], gap: int = 3) -> list[list[int]]:
    out: list[list[int]] = []
    for s in sorted(steps):
        if out and s - out[-1][-1] <= gap:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def spike_thresholds(params: dict[str, str]) -> SpikeConfig:
    defaults = SpikeConfig()
    kw: dict[str, Any] = {}
    for name in ("ema_alpha", "loss_sigma", "min_loss_jump", "grad_factor"):
        kw[name] = float(params.get(f"spike.{name}", getattr(defaults, name)))
    kw["grad_window"] = int(params.get("spike.grad_window", defaults.grad_window))
    # runs logged before the rename have spike.warmup_steps
    kw["baseline_steps"] = int(
        params.get("spike.baseline_steps", params.get("spike.warmup_steps", defaults.baseline_steps))
    )
    return SpikeConfig(**kw)


def find_spike(points: list[runs.MetricPoint], thresholds: SpikeConfig, grad_clip: float) -> Spike | None:
    injected = sorted(s for s, v in _series(points, N.SPIKE_INJECTED).items() if v > 0)
    if injected:
        return Spike(
            "injected", "spike/injected metric (--inject-spike-at-step)", injected[0], injected[-1], tuple(injected)
        )
    detected = sorted(s for s, v in _series(points, N.SPIKE_DETECTED).items() if v > 0)
    if detected:
        first = _clusters(detected)[0]
        return Spike("natural", "spike/detected metric (the trainer's detector)", first[0], first[-1], tuple(first))
    loss, grad = _series(points, N.TRAIN_LOSS), _series(points, N.TRAIN_GRAD_NORM)
    t = thresholds
    det = SpikeDetector(t.ema_alpha, t.baseline_steps, t.loss_sigma, t.min_loss_jump, t.grad_factor, t.grad_window)
    found = [s for s in sorted(loss) if det.observe(s, loss[s], grad.get(s, 0.0), grad_clip)]
    if found:
        first = _clusters(found)[0]
        return Spike(
            "natural",
            "the detector re-run over the logged train/loss (it flagged nothing live)",
            first[0],
            first[-1],
            tuple(first),
        )
    return None


@dataclass(frozen=True)
class Analysis:
    baseline: float
    baseline_std: float
    baseline_grad: float
    margin: float
    peak_loss: float
    peak_loss_step: int
    peak_grad: float
    peak_grad_step: int
    clipped_steps: int
    spike_steps_logged: int
    recovered_at: int | None


def analyse(spike: Spike, loss: dict[int, float], grad: dict[int, float], grad_clip: float) -> Analysis:
    logged = [s for s in sorted(loss) if s < spike.first]
    before = [s for s in logged if s >= spike.first - BEFORE]
    if len(before) < 3:  # sparse logging: fall back to the last few logged steps
        before = logged[-5:]
    if len(before) < 2:
        raise X1Error(
            f"the spike at step {spike.first} has fewer than 2 logged steps before it; "
            "there is no baseline to compare with"
        )
    # The pre-spike trend: a straight line through those losses, read off just before the spike.
    xs, ys = [float(s) for s in before], [loss[s] for s in before]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    base = my + slope * (spike.first - 1 - mx)
    std = statistics.pstdev([y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)])
    base_grad = statistics.median(grad[s] for s in before if s in grad) if any(s in grad for s in before) else math.nan
    margin = max(0.1, 2 * std)
    window = [s for s in sorted(loss) if spike.first <= s <= spike.last + 3]
    peak_loss_step = max(window, key=lambda s: loss[s])
    gwin = [s for s in sorted(grad) if spike.first <= s <= spike.last + 10] or [spike.first]
    peak_grad_step = max(gwin, key=lambda s: grad.get(s, -math.inf))
    spike_logged = [s for s in spike.steps if s in grad]
    clipped = sum(1 for s in spike_logged if grad_clip > 0 and grad[s] > grad_clip)
    recovered = next((s for s in sorted(loss) if s > spike.last and loss[s] <= base + margin), None)
    return Analysis(
        base,
        std,
        base_grad,
        margin,
        loss[peak_loss_step],
        peak_loss_step,
        grad.get(peak_grad_step, math.nan),
        peak_grad_step,
        clipped,
        len(spike_logged),
        recovered,
    )


def _fmt(v: float | None, digits: int = 4) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def render(
    run: runs.RunRecord,
    spike: Spike,
    a: Analysis,
    points: list[runs.MetricPoint],
    grad_clip: float,
    thresholds: SpikeConfig,
    plot_name: str,
) -> str:
    loss, grad = _series(points, N.TRAIN_LOSS), _series(points, N.TRAIN_GRAD_NORM)
    val, lr = _series(points, N.VAL_LOSS), _series(points, N.TRAIN_LR)
    end = (a.recovered_at or spike.last + 20) + 3
    rows = [s for s in sorted(loss) if s < spike.first][-SHOW_BEFORE:] + [
        s for s in sorted(loss) if spike.first <= s <= end
    ]
    beta2 = run.params.get("optim.beta2", "?")
    lines = [
        f"# Loss-spike post-mortem: run `{run.run_name}`",
        "",
        f"- MLflow: `{redact.url(run.uri)}` run `{run.run_id}`",
        f"- Spike: **{spike.kind}**, steps {spike.first}–{spike.last} ({len(spike.steps)} steps), found from the "
        f"{spike.source}.",
    ]
    if spike.kind == "injected":
        lines.append(
            f"- Injected with `--inject-spike-at-step {run.tags.get(N.TAG_SPIKE_INJECT_AT_STEP, spike.first)} "
            f"--spike-batches {run.tags.get(N.TAG_SPIKE_BATCHES, len(spike.steps))}`: rare-token batches "
            "(the bottom 1% of the train split's unigram distribution, weighted towards the rarest)."
        )
    rec = (
        f"step {a.recovered_at}, {a.recovered_at - spike.last} steps after the last spike step "
        f"({a.recovered_at - spike.first} after the first)"
        if a.recovered_at is not None
        else "not within the logged steps"
    )
    ratio_g = a.peak_grad / a.baseline_grad if a.baseline_grad and not math.isnan(a.baseline_grad) else math.nan
    lines += [
        "",
        "## The numbers",
        "",
        "| | value |",
        "|---|---|",
        f"| baseline loss (the pre-spike trend: a line through the logged losses of the {BEFORE} steps before, "
        f"read at step {spike.first - 1}) | {a.baseline:.4f} (residual std {a.baseline_std:.4f}) |",
        f"| peak loss | {a.peak_loss:.4f} at step {a.peak_loss_step} (+{a.peak_loss - a.baseline:.3f} nats, "
        f"x{a.peak_loss / a.baseline:.2f}) |",
        f"| baseline grad norm (median before, pre-clip) | {_fmt(a.baseline_grad, 3)} |",
        f"| peak grad norm (pre-clip) | {_fmt(a.peak_grad, 3)} at step {a.peak_grad_step} (x{_fmt(ratio_g, 1)}) |",
        f"| grad clipping (max norm {grad_clip:g}) | active on {a.clipped_steps} of {a.spike_steps_logged} spike "
        f"steps: {'it caught the spike' if a.clipped_steps else 'it did not engage'} |",
        f"| AdamW β₂ | {beta2} |",
        f"| recovery (loss back within {a.margin:.3f} nats of the baseline) | {rec} |",
        "",
        f"![loss and grad norm around the spike]({plot_name})",
        "",
        "## Timeline",
        "",
        "| step | train loss | val loss | grad norm (pre-clip) | clip ratio | lr | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        g = grad.get(s)
        ratio = min(1.0, grad_clip / g) if g and grad_clip > 0 else None
        note = (
            "injected"
            if spike.kind == "injected" and s in spike.steps
            else ("spike" if s in spike.steps else ("recovered" if s == a.recovered_at else ""))
        )
        lines.append(
            f"| {s} | {_fmt(loss.get(s))} | {_fmt(val.get(s))} | {_fmt(g, 3)} | {_fmt(ratio, 3)} | "
            f"{_fmt(lr.get(s), 6) if s in lr else '—'} | {note} |"
        )
    lines += [
        "",
        "## Root cause",
        "",
        "> **TO BE WRITTEN BY YOU.** "
        + (
            "The spike was provoked on purpose; say whether the run absorbed it as expected (clipping engaged on "
            f"{a.clipped_steps} steps, β₂ = {beta2}) and what the recovery time tells you about the optimizer state."
            if spike.kind == "injected"
            else "What in the data (look at the batches of these steps: `Sampler.starts(step, chunk)` gives their "
            "token offsets), the learning rate or the precision explains it?"
        ),
        "",
        "## Lessons",
        "",
        "> **TO BE WRITTEN BY YOU.** What to change (thresholds, `--spike-skip-steps`, lr, data filtering) and "
        "what to watch next time.",
        "",
        "## How this was measured",
        "",
        f"- Detector thresholds: loss above its moving baseline by {thresholds.loss_sigma:g} noise units and at "
        f"least {thresholds.min_loss_jump:g} nats, or grad norm above {thresholds.grad_factor:g}x the median of "
        f"the last {thresholds.grad_window} steps (baseline EMA α {thresholds.ema_alpha:g}, warm-up "
        f"{thresholds.baseline_steps} steps).",
        f"- Recovery margin: max(0.1, 2 x the residual std of the pre-spike trend) = {a.margin:.3f} nats. Clip ratio = "
        "min(1, max norm / grad norm): the factor clipping scaled the update by.",
        f"- Drafted by `python -m x1_pretrain.postmortem` from `{redact.url(run.uri)}`.",
        "",
    ]
    return "\n".join(lines)


def plot(spike: Spike, a: Analysis, points: list[runs.MetricPoint], grad_clip: float, path: Path, title: str) -> None:
    from .plots import _pyplot, _save

    loss, grad = _series(points, N.TRAIN_LOSS), _series(points, N.TRAIN_GRAD_NORM)
    lo = spike.first - 30
    hi = (a.recovered_at or spike.last + 30) + 20
    xs = [s for s in sorted(loss) if lo <= s <= hi]
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9.0, 6.0), sharex=True)
    ax1.plot(xs, [loss[s] for s in xs], color="tab:blue", linewidth=1.2, marker=".", label="train loss")
    ax1.axhline(a.baseline, color="gray", linestyle="--", linewidth=1, label=f"baseline {a.baseline:.3f}")
    ax1.axhspan(a.baseline - a.margin, a.baseline + a.margin, color="gray", alpha=0.12, label="recovery margin")
    gx = [s for s in xs if s in grad]
    ax2.plot(gx, [grad[s] for s in gx], color="tab:red", linewidth=1.2, marker=".", label="grad norm (pre-clip)")
    if grad_clip > 0:
        ax2.axhline(grad_clip, color="black", linestyle=":", linewidth=1, label=f"clip at {grad_clip:g}")
    for ax in (ax1, ax2):
        ax.axvspan(
            spike.first - 0.5,
            spike.last + 0.5,
            color="tab:orange",
            alpha=0.2,
            label=f"{spike.kind} spike" if ax is ax1 else None,
        )
        if a.recovered_at is not None:
            ax.axvline(a.recovered_at, color="tab:green", linewidth=1, label="recovered" if ax is ax1 else None)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)
    ax1.set(title=title, ylabel="loss (nats/token)")
    ax2.set(xlabel="optimizer step", ylabel="grad norm")
    _save(fig, path)


class NoSpike(Exception):
    """The run has no spike to write about (not a usage error: exit 1)."""


def write_postmortem(uri: str, run_id: str | None, experiment: str, output: Path) -> str:
    """Write the draft and ``spike.png`` beside it; returns a one-line summary. Raises :class:`NoSpike`."""
    run = runs.load_run(uri, run_id, experiment)
    points, _ = runs.dedupe(run.metrics)
    grad_clip = float(run.params.get("optim.grad_clip", "1.0"))
    thresholds = spike_thresholds(run.params)
    if not _series(points, N.TRAIN_LOSS):
        raise X1Error(f"run {run.run_id} has no train/loss metric; nothing to analyse")
    spike = find_spike(points, thresholds, grad_clip)
    if spike is None:
        raise NoSpike(
            f"no spike found in run {run.run_id}: no injected steps, no steps flagged by the detector, "
            f"and none in the logged losses with loss_sigma {thresholds.loss_sigma:g}, min_loss_jump "
            f"{thresholds.min_loss_jump:g} nats, grad_factor {thresholds.grad_factor:g} (grad_window "
            f"{thresholds.grad_window}, warm-up {thresholds.baseline_steps} steps)"
        )
    a = analyse(spike, _series(points, N.TRAIN_LOSS), _series(points, N.TRAIN_GRAD_NORM), grad_clip)
    output.parent.mkdir(parents=True, exist_ok=True)
    png = output.with_name("spike.png")
    tmp_png = png.with_name(f".{png.name}.tmp-{os.getpid()}.png")
    plot(spike, a, points, grad_clip, tmp_png, f"{spike.kind} loss spike at step {spike.first} (run {run.run_name})")
    os.replace(tmp_png, png)
    write_text_atomic(output, render(run, spike, a, points, grad_clip, thresholds, png.name))
    return (
        f"{spike.kind} spike at steps {spike.first}-{spike.last}: peak loss {a.peak_loss:.3f} vs "
        f"baseline {a.baseline:.3f}; recovered at step {a.recovered_at}; wrote {output} and {png}"
    )
