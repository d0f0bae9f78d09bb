"""gpu_check.md: the tables of bench/gpu_check.py's phases (kept apart from the measuring code)."""

from __future__ import annotations

import math
import time
from typing import Any


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return format(x, spec)


def _status(r: Any) -> str:
    return f"{r.status} ({r.wall_s:.0f} s)"


def _grads(r: Any) -> list[str]:
    d = r.data
    lines = [
        f"## Gradients: eager vs compiled, with accumulation — {_status(r)}",
        "",
        f"{d.get('shape', '')}; pass when every tensor's relative L2 difference ≤ {d.get('tolerance', '?')}."
        + (f" Skipped: {d['skipped']}." if d.get("skipped") else ""),
        "",
        "| mode | mean loss | max relative grad diff vs eager | first call s | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in d.get("rows", []):
        lines.append(
            f"| {row['mode']} | {_fmt(row['loss'], '.4f')} | {_fmt(row['max_rel_grad_diff'], '.2e')} | "
            f"{_fmt(row['first_call_s'], '.1f')} | {'same' if row['ok'] else 'DIFFERENT'} |"
        )
    return lines


def _breaks(r: Any) -> list[str]:
    lines = [
        f"## Graph breaks (torch._dynamo.explain) — {_status(r)}",
        "",
        "| what | graphs | breaks | reasons |",
        "|---|---|---|---|",
    ]
    for row in r.data.get("rows", []):
        lines.append(f"| {row['what']} | {row['graphs']} | {row['breaks']} | {'; '.join(row['reasons']) or '—'} |")
    if "sdpa_backends_for_gqa_bf16" in r.data:
        lines += [
            "",
            "SDPA backends that run x1's GQA attention (12 query / 4 KV heads, bf16): "
            + (", ".join(r.data["sdpa_backends_for_gqa_bf16"]) or "none")
            + ".",
        ]
    return lines


def _bf16(r: Any) -> list[str]:
    d = r.data
    lines = [
        f"## bf16 vs fp32: {d.get('steps', '?')} optimizer steps on one fixed batch, one init — {_status(r)}",
        "",
        "| run | loss first → last | max rel Δ vs fp32 | final abs Δ | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in d.get("rows", []):
        lines.append(
            f"| {row['run']} | {_fmt(row['first'], '.3f')} → {_fmt(row['last'], '.3f')} | "
            f"{_fmt(row['max_rel_diff'], '.4f')} | {_fmt(row['final_abs_diff'], '.4f')} | "
            f"{'tracks (rel ≤ 2%, final ≤ 0.1)' if row['ok'] else 'DOES NOT TRACK'} |"
        )
    return lines


def _trainer(r: Any, smoke: bool) -> list[str]:
    d = r.data
    m, tags, fig = d.get("metrics", {}), d.get("tags", {}), d.get("figures", {})
    what = "the config's own compile mode" if r.phase == "trainer-lab-mode" else "compile mode default"
    lines = [
        f"## The real trainer ({what}): `python -m x1_pretrain.train`, {fig.get('steps_done', '?')} of "
        f"{d.get('steps', '?')} steps on synthetic tokens — {_status(r)}",
        "",
    ]
    if d.get("skipped"):
        return [*lines[:1], "", f"Skipped: {d['skipped']}."]
    # the warm speed from the progress file (kept when the phase is cut); the trainer's own figures beside it
    lines += [
        "| tokens/s (warm) | MFU honest | MFU lab 6N | s / optimizer step | first step s (compile) | "
        "peak mem GiB | compile mode | attention | exit |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {_fmt(fig.get('tokens_per_s', m.get('train/tokens_per_s')), ',.0f')} | "
        f"{_fmt(fig.get('mfu', m.get('train/mfu')), '.3f')} | "
        f"{_fmt(fig.get('mfu_lab_6n', m.get('train/mfu_lab_6n')), '.3f')} | "
        f"{_fmt(fig.get('step_s', m.get('train/step_time_s')), '.3f')} | "
        f"{_fmt(fig.get('first_step_s', m.get('train/first_step_s')), '.1f')} | "
        f"{_fmt(m.get('train/peak_mem_gib'), '.1f')} | "
        f"{tags.get('compile_mode_effective', '—')} | {tags.get('attention_effective', '—')} | "
        f"{d.get('exit_code') if d.get('exit_code') is not None else 'stopped: ' + str(d.get('cut'))} |",
        "",
    ]
    if m.get("train/tokens_per_s") and fig.get("tokens_per_s"):
        lines.append(
            f"The trainer's own last logged window: {m['train/tokens_per_s']:,.0f} tokens/s, MFU "
            f"{_fmt(m.get('train/mfu'), '.3f')}; the table's speed is over the {fig.get('warm_steps', '?')} "
            "warm steps of the progress file."
        )
    if tags.get("kernels"):
        lines.append(f"Kernels: {tags['kernels']}.")
    if tags.get("compile_fallback"):
        lines.append(f"**torch.compile failed and the trainer fell back to eager**: {tags['compile_fallback']}")
    step_s = fig.get("step_s") or m.get("train/step_time_s")
    if step_s and not smoke and r.status.startswith("ok"):
        per_day = int(24 * 3600 / step_s)
        lines.append(
            f"At {step_s:.3f} s per optimizer step of {d.get('tokens_per_step', 0):,} tokens: ~{per_day:,} "
            f"steps in 24 h. For the launch gate on this GPU: `--budget-expected-step-s {step_s:.3f}`."
        )
    if d.get("command"):
        lines += ["", f"Command: `{d['command']}`"]
    return lines


def _ab(r: Any) -> list[str]:
    d = r.data
    lines = [
        f"## A/B of the speed switches, {d.get('mode', '?')} — {_status(r)}",
        "",
        "Each row flips one switch of the config; same init, same batches, lab micro-batch.",
        "",
        "| variant | attention | micro-steps | tokens/s | vs baseline | peak mem GiB | first loss Δ | "
        "grads repeat bitwise | first 2 micro-steps s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in d.get("rows", []):
        if "skipped" in row:
            lines.append(f"| {row['variant']} | — | — | — | skipped: {row['skipped']} | — | — | — | — |")
            continue
        repeat = {True: "yes", False: "NO"}.get(row.get("repeatable"), "—")
        name = row["variant"] + (
            f" (**compile failed, ran eagerly**: {row['compile_failed']})" if row.get("compile_failed") else ""
        )
        lines.append(
            f"| {name} | {row['attention']} | {row['micro_steps']} | "
            f"{_fmt(row['tokens_per_s'], ',.0f')} | {_fmt(row['speed_vs_baseline'], '.3f')} | "
            f"{_fmt(row['peak_mem_gib'], '.1f')} | {_fmt(row['loss_diff_vs_baseline'], '.1e')} | {repeat} | "
            f"{_fmt(row.get('first_s'), '.1f')} |"
        )
    return lines


def _optimizer_ab(r: Any) -> list[str]:
    d = r.data
    lines = [
        f"## Optimizer A/B: AdamW against Muon — {_status(r)}",
        "",
        f"Data: {d.get('data', '?')}. {d.get('steps', '?')} steps of {_fmt(d.get('tokens_per_step'), ',')} tokens "
        f"({_fmt(d.get('epochs'), '.2f')} epochs of the train split), one init, the same batches, warm-up 10 % then "
        "cosine over the run. A short horizon: whether Muon's lead holds here, not what a day's run ends at.",
        "",
    ]
    rows = d.get("rows", [])
    if rows:
        points = sorted(rows[0]["curve"], key=int)
        lines += [
            "| arm | lr | " + " | ".join(f"val @ {p}" for p in points) + " | s/step |",
            "|---|---|" + "---|" * len(points) + "---|",
        ]
        for row in rows:
            vals = " | ".join(_fmt(row["curve"].get(p), ".4f") for p in points)
            lines.append(f"| {row['arm']} | {row['lr']:g} | {vals} | {_fmt(row['s_per_step'], '.3f')} |")
    if len(rows) == 2:
        reach, fewer = d.get("muon_reaches_adamw_final_at"), d.get("fewer_tokens")
        lines += [
            "",
            f"Muon reaches AdamW's final val loss at step {reach:.0f} of {d['steps']}: {fewer:.2f}x fewer tokens; "
            f"its step takes {_fmt(d.get('muon_time_ratio'), '.2f')}x AdamW's."
            if reach
            else "Muon does not reach AdamW's final val loss in this run.",
        ]
    return lines


def _profile(r: Any) -> list[str]:
    d = r.data
    groups = d.get("groups_ms", {})
    wall = d.get("wall_ms") or math.nan
    failed = (
        f" **torch.compile failed, the profile is eager's**: {d['compile_failed']}." if d.get("compile_failed") else ""
    )
    lines = [
        f"## Profile: {d.get('what', '')} — {_status(r)}",
        "",
        f"Wall {_fmt(wall, '.1f')} ms.{failed}",
        "",
        "| group | ms | share of wall |",
        "|---|---|---|",
    ]
    for group, ms in groups.items():
        lines.append(f"| {group} | {ms:.1f} | {_fmt(ms / wall if wall else math.nan, '.1%')} |")
    return lines


def markdown(info: dict[str, Any], results: list[Any], smoke: bool, total_s: float) -> str:
    lines = [f"# x1 GPU check ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {total_s:.0f} s)", ""]
    if smoke:
        lines += [
            "**No CUDA GPU detected**: every phase ran on a tiny config on the CPU, without compilation — a "
            "smoke test of the code paths. Nothing below is a measurement.",
            "",
        ]
    lines += ["| item | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in info.items()] + [""]
    lines += ["| phase | status |", "|---|---|"] + [f"| {r.phase} | {_status(r)} |" for r in results] + [""]
    render = {
        "grads": _grads,
        "graph-breaks": _breaks,
        "bf16-vs-fp32": _bf16,
        "ab-eager": _ab,
        "ab-compiled": _ab,
        "optimizer-ab": _optimizer_ab,
        "profile": _profile,
    }
    for r in results:
        if r.phase in ("trainer", "trainer-lab-mode") and r.data:
            lines += [*_trainer(r, smoke), ""]
        elif r.phase in render and r.data:
            lines += [*render[r.phase](r), ""]
    return "\n".join(lines) + "\n"
