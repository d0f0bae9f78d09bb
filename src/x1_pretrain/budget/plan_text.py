"""The plan as text: what ``python -m x1_pretrain.plan`` prints (model, throughput, run, cost, verdict,
what fits, the Chinchilla prediction)."""

from __future__ import annotations

from ..model import flops
from .planner import CHINCHILLA, GPUS, Plan, chinchilla_loss


def _b(tokens: float) -> str:
    return f"{tokens / 1e9:,.2f}B"


def _usd(x: float) -> str:
    return f"${x:,.2f}"


def _fastest_other(peak: float | None) -> tuple[str, float] | None:
    best = max(flops.PEAK_TFLOPS_BF16[k] for k, _ in GPUS.values())
    if peak is not None and peak >= best:
        return None
    return "/".join(n for n, (k, _) in GPUS.items() if flops.PEAK_TFLOPS_BF16[k] == best), best


def render(plan: Plan, config_path: str, steps_source: str) -> str:
    fpt, counts = plan.fpt, flops.param_counts(plan.config.model)
    where = f"{plan.n_gpus}x {plan.gpu}" + (
        f" ({plan.peak_tflops:g} TFLOP/s bf16 dense each)" if plan.peak_tflops else " (peak unknown: no MFU)"
    )
    out = [f"plan: {config_path} on {where} at {_usd(plan.rate_usd_per_hr)}/h", "", "model"]
    out.append(f"  parameters   {counts.non_embedding:>12,} non-embedding (N in the Chinchilla convention)")
    out.append(f"             + {counts.embedding:>12,} embedding (= the tied LM head)")
    out.append(f"             = {counts.total:>12,} (+{counts.norm_gains:,} RMSNorm gains)")
    out.append(
        f"  FLOPs/token  {fpt.honest:.3e} honest = 6N {fpt.matmul_non_embedding:.3e} + LM head "
        f"{fpt.lm_head:.3e} + attention {fpt.attention:.3e}"
    )
    out.append(
        f"               {fpt.lab_6n:.3e} the lab's 6N figure (leaves out the LM head and attention: "
        f"{1 - fpt.lab_6n / fpt.honest:.0%} of the real cost)"
    )
    mfu, mfu6 = plan.mfu(fpt.honest), plan.mfu(fpt.lab_6n)
    if plan.measured:
        implied = f": MFU {mfu:.3f} honest ({mfu6:.3f} in the lab's 6N accounting)" if mfu else ""
        out += ["", f"throughput {plan.tokens_per_s:,.0f} tokens/s measured{implied}"]
    else:
        out += [
            "",
            f"throughput at MFU {mfu:.2f} (assumed; --tokens-per-s to use a measured figure)",
            f"  tokens/s     {plan.tokens_per_s:,.0f} (the lab's 6N accounting would claim "
            f"{plan.tokens_per_s * fpt.honest / fpt.lab_6n:,.0f} at the same MFU: docs/errata.md, 1)",
        ]
    out.append(f"  steps/hour   {plan.steps_per_hour:,.1f} of {plan.tokens_per_step:,} tokens")
    out += [
        "",
        f"run: {plan.steps:,} steps = {_b(plan.tokens)} tokens ({steps_source})",
        f"  time         {plan.hours:,.1f} h of training" + (" (task evals included)" if plan.eval_s else ""),
    ]
    out += eval_lines(plan)
    billed = f"({plan.hours:,.1f} h + {plan.setup_hours:g} h set-up)" if plan.setup_hours else f"{plan.hours:,.1f} h"
    rows = [
        (f"compute ({billed} x {_usd(plan.rate_usd_per_hr)}/h)", plan.compute_usd()),
        (f"final checkpoint, export, shutdown ({plan.reserve_min:g} min)", plan.reserve_usd),
        *([(f"task eval at the end (at most {plan.final_eval_s:,.0f} s)", plan.final_eval_usd)] if plan.eval_s else []),
        ("storage egress", plan.lines.egress_usd),
        ("persistent disk", plan.lines.disk_usd),
        ("buffer (1 restart)", plan.lines.buffer_usd),
        ("total", plan.total_usd()),
    ]
    out += ["", "cost"] + [f"  {name:<44}{_usd(v):>10}" for name, v in rows]
    out.append(f"  {'cap':<44}{_usd(plan.cap_usd):>10}")
    if not plan.setup_hours:
        out.append("  (the lab's table bills ~26 h for 24 h of training: --setup-hours 2 counts set-up and tokenizing)")
    out += ["", verdict(plan), "", *what_fits(plan), "", *chinchilla_lines(plan, counts)]
    return "\n".join(out)


def eval_lines(plan: Plan) -> list[str]:
    """The task evaluations' share of the time: how many, how long each (estimated), and what they cost."""
    if not plan.eval_s:
        return []
    t, e = plan.config.train, plan.evals
    runs = ((plan.steps - 1) // e.every if e.every else 0) + 1  # none on the schedule at the last step: the final
    hours = runs * plan.eval_s / 3600
    every = f"every {e.every:,} steps and " if e.every else ""
    items = f"first {t.eval_tasks_limit:,} items each" if t.eval_tasks_limit else "all items"
    capped = f", cut at {e.cap_s:g} s" if plan.eval_s >= e.cap_s else ""
    return [
        f"  task evals   {t.eval_tasks} ({items}) {every}at the end: ~{plan.eval_s:,.0f} s each{capped} "
        f"(forward only, assumed at half the training speed),",
        f"               {runs:,} runs = {hours:,.2f} h, {_usd(hours * plan.rate_usd_per_hr)}; the one at the end "
        f"is in the reserve at its time cap ({e.cap_s:g} s) until one has been timed",
    ]


def verdict(plan: Plan) -> str:
    mfu = plan.mfu(plan.fpt.honest)
    speed = f"MFU {mfu:.2f}" if mfu and not plan.measured else f"{plan.tokens_per_s:,.0f} tokens/s"
    head = f"{plan.steps:,} steps on {plan.n_gpus}x {plan.gpu} at {speed}"
    time_s = f"take {plan.hours:,.1f} h (window {plan.max_hours:g} h)"
    cost_s = f"cost {_usd(plan.total_usd())} in all (cap {_usd(plan.cap_usd)})"
    if plan.fits_time and plan.fits_cap:
        return f"verdict: FITS. {head} {time_s} and {cost_s}."
    why = []
    if not plan.fits_time:
        why.append(f"do not fit in {plan.max_hours:g} h: they take {plan.hours:,.1f} h")
    if not plan.fits_cap:
        why.append(f"do not fit in {_usd(plan.cap_usd)}: they cost {_usd(plan.total_usd())} in all")
        if plan.total_usd(buffer=False) <= plan.cap_usd:
            why[-1] += f" (within the cap only if the {_usd(plan.lines.buffer_usd)} restart buffer is never used)"
    return f"verdict: DOES NOT FIT. {head} " + "; they ".join(why) + "."


def what_fits(plan: Plan) -> list[str]:
    how = f"{plan.tokens_per_s:,.0f} tokens/s"
    cap_h = plan.hours_for_cap(buffer=True)
    both_h = min(plan.max_hours, cap_h)
    out = [
        f"what fits at {how} on {plan.gpu}:",
        f"  in {plan.max_hours:g} h: {plan.steps_in(plan.max_hours):,} steps = "
        f"{_b(plan.steps_in(plan.max_hours) * plan.tokens_per_step)} tokens, "
        f"{_usd(plan.total_usd(plan.max_hours))} in all",
        f"  under the {_usd(plan.cap_usd)} cap, keeping the buffer: {cap_h:,.1f} h = {plan.steps_in(cap_h):,} steps",
    ]
    if both_h <= 0:
        return [*out, "  nothing fits: the fixed lines and the buffer alone exceed the cap"]
    best = plan.steps_that_fit()
    hrs = best / plan.steps_per_hour
    out.append(
        f"  the largest run inside both: {best:,} steps (--total-steps {best}; "
        f"{_b(best * plan.tokens_per_step)} tokens, {hrs:,.1f} h, {_usd(plan.total_usd(hrs))} in all)"
    )
    if not plan.fits_time:
        need = plan.steps * plan.tokens_per_step / (plan.max_hours * 3600)
        line = f"  {plan.steps:,} steps in {plan.max_hours:g} h would need {need:,.0f} tokens/s"
        if plan.peak_tflops:
            here = need * plan.fpt.honest / (plan.peak_tflops * 1e12 * plan.n_gpus)
            line += f": MFU {here:.2f} on {plan.gpu}" + (" (out of reach)" if here > 0.7 else "")
        other = _fastest_other(plan.peak_tflops)
        if other:
            line += (
                f", MFU {need * plan.fpt.honest / (other[1] * 1e12 * plan.n_gpus):.2f} on {other[0]} "
                f"({other[1]:g} TFLOP/s)"
            )
        out.append(line)
    return out


def chinchilla_lines(plan: Plan, counts: flops.ParamCounts) -> list[str]:
    c = CHINCHILLA
    return [
        f"predicted loss (Chinchilla, Hoffmann et al. 2022): L(N, D) = E + A/N^alpha + B/D^beta, "
        f"E {c['E']}, A {c['A']}, B {c['B']}, alpha {c['alpha']}, beta {c['beta']}",
        f"  N = {counts.non_embedding / 1e6:.1f}M non-embedding, D = {_b(plan.tokens)} tokens: "
        f"{chinchilla_loss(counts.non_embedding, plan.tokens):.2f}",
        f"  N = {counts.total / 1e6:.1f}M counting the embedding too:       "
        f"{chinchilla_loss(counts.total, plan.tokens):.2f}",
        "  caveat: the fit was made on MassiveText with a SentencePiece tokenizer; GPT-2 BPE on FineWeb-Edu",
        "  gives other nats per token, so read it as the shape of the curve, not a target (the lab's DoD band",
        "  is [3.20, 3.50])",
    ]
