"""The run bundle's figures: loss, grad/param norm and throughput, drawn with matplotlib (Agg, no display).

Each function takes the metric points of one run and writes one PNG; nothing here reads MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runs import MetricPoint

SIZE_IN = (9.0, 5.0)
DPI = 110  # 990 x 550 pixels: readable on a laptop screen and in a pull request


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _xy(points: list[MetricPoint]) -> tuple[list[int], list[float]]:
    return [p.step for p in points], [p.value for p in points]


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    _pyplot().close(fig)


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} logged", ha="center", va="center", transform=ax.transAxes, fontsize=12)


def loss_curve(
    train: list[MetricPoint], val: list[MetricPoint], path: Path, title: str, band: tuple[float, float] | None = None
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE_IN)
    if train:
        ax.plot(*_xy(train), label="train loss", color="tab:blue", linewidth=1.2)
    if val:
        ax.plot(*_xy(val), label="val loss", color="tab:orange", marker="o", markersize=4, linewidth=1.5)
        last = val[-1]
        ax.annotate(
            f"final val {last.value:.3f}",
            (last.step, last.value),
            textcoords="offset points",
            xytext=(-10, 12),
            ha="right",
            fontsize=9,
        )
    if band is not None:
        ax.axhspan(band[0], band[1], color="tab:green", alpha=0.12, label=f"lab DoD band [{band[0]}, {band[1]}]")
    if not (train or val):
        _no_data(ax, "loss")
    ax.set(title=title, xlabel="optimizer step", ylabel="cross-entropy loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    _save(fig, path)


def gradnorm_curve(
    grad: list[MetricPoint], param: list[MetricPoint], path: Path, title: str, clip: float | None = None
) -> None:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=SIZE_IN, sharex=True)
    if grad:
        top.plot(*_xy(grad), color="tab:red", linewidth=1.0, label="grad norm (before clipping)")
        if clip:
            top.axhline(clip, color="gray", linestyle="--", linewidth=1.0, label=f"clip threshold {clip:g}")
        top.legend(loc="upper right")
    else:
        _no_data(top, "grad norm")
    top.set(title=title, ylabel="global L2 norm")
    top.grid(alpha=0.3)
    if param:
        bottom.plot(*_xy(param), color="tab:purple", linewidth=1.2, label="param norm")
        bottom.legend(loc="lower right")
    else:
        _no_data(bottom, "param norm")
    bottom.set(xlabel="optimizer step", ylabel="global L2 norm")
    bottom.grid(alpha=0.3)
    _save(fig, path)


def throughput(tps: list[MetricPoint], restarts: list[MetricPoint], start_ms: int, path: Path, title: str) -> None:
    """tokens/s against wall-clock hours (minutes for a run under an hour) since the run started; each resume
    is a dashed vertical line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE_IN)

    span_ms = max((p.timestamp_ms for p in [*tps, *restarts]), default=start_ms) - start_ms
    unit, per_ms = ("hours", 3.6e6) if span_ms >= 3.6e6 else ("minutes", 6e4)  # a short run reads better in minutes

    def at(p: MetricPoint) -> float:
        return (p.timestamp_ms - start_ms) / per_ms

    if tps:
        ax.plot(
            [at(p) for p in tps],
            [p.value / 1e3 for p in tps],
            color="tab:blue",
            linewidth=1.0,
            marker="." if len(tps) < 200 else None,
            label="tokens/s (mean over the recent steps)",
        )
    else:
        _no_data(ax, "throughput")
    for i, r in enumerate(restarts):
        ax.axvline(
            at(r),
            color="tab:red",
            linestyle="--",
            linewidth=1.2,
            label="restart (resumed from a checkpoint)" if i == 0 else None,
        )
        ax.annotate(
            f"restart at step {r.step}",
            (at(r), 0.02),
            xycoords=("data", "axes fraction"),
            rotation=90,
            fontsize=8,
            color="tab:red",
            ha="right",
            va="bottom",
        )
    ax.set(
        title=title, xlabel=f"wall-clock time since the run started ({unit})", ylabel="throughput (thousand tokens/s)"
    )
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if tps or restarts:
        ax.legend(loc="lower right")
    _save(fig, path)
