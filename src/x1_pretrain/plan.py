"""Will the run fit? Time, tokens and dollars for a config on a GPU, before any money is spent.

    python -m x1_pretrain.plan --config configs/x1-50m-a100.yaml --gpu a100-80gb --rate-usd-per-hr 1.10 \\
        [--hours 24 | --total-steps N] [--mfu 0.48 | --tokens-per-s MEASURED]

Throughput comes from the honest FLOPs per token (6N + tied LM head + attention; see ERRATA 1) at an
assumed MFU, or from a measured tokens/s. Cost uses the lab's lines: compute (hours x rate), storage egress
$1, persistent disk $2, a $5 buffer for one restart, against the $35 cap. The predicted loss is Hoffmann
et al. (2022)'s fit, shown with its constants and the caveat that it was fitted on another tokenizer and corpus.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from . import config as C
from . import flops
from .errors import X1Error

# --gpu name -> (key of flops.PEAK_TFLOPS_BF16, memory in GB). Dense bf16 peaks, SXM parts for H100/H200.
GPUS: dict[str, tuple[str, int]] = {
    "a100-80gb": ("a100", 80), "a100-40gb": ("a100", 40), "h100": ("h100", 80), "h200": ("h200", 141),
    "h800": ("h800", 80), "l40s": ("l40s", 48), "a10g": ("a10g", 24), "l4": ("l4", 24),
    "rtx4090": ("rtx 4090", 24), "rtx3090": ("rtx 3090", 24), "v100": ("v100", 32),
}
# Hoffmann et al. 2022 ("Chinchilla"), approach 3: L(N, D) = E + A / N^alpha + B / D^beta.
CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def chinchilla_loss(n_params: float, n_tokens: float) -> float:
    c = CHINCHILLA
    return c["E"] + c["A"] / n_params ** c["alpha"] + c["B"] / n_tokens ** c["beta"]


def gpu_peak(name: str) -> float:
    key = name.lower()
    if key not in GPUS:
        raise X1Error(f"--gpu {name!r} is not in the table; choose one of {', '.join(GPUS)} "
                      "(or give --peak-tflops for another GPU)")
    return flops.PEAK_TFLOPS_BF16[GPUS[key][0]]


@dataclass(frozen=True)
class Lines:
    """The lab's budget lines besides compute (USD)."""

    egress_usd: float = 1.0
    disk_usd: float = 2.0
    buffer_usd: float = 5.0

    @property
    def fixed(self) -> float:
        return self.egress_usd + self.disk_usd


@dataclass(frozen=True)
class Plan:
    config: C.Config
    gpu: str
    n_gpus: int
    peak_tflops: float | None   # per device
    rate_usd_per_hr: float      # the whole instance
    tokens_per_s: float
    measured: bool              # tokens/s measured (True) or from an assumed MFU
    steps: int
    cap_usd: float
    max_hours: float            # the run's time window (the lab's: 24 h)
    setup_hours: float = 0.0    # billed hours outside training (set-up, tokenization, export)
    lines: Lines = Lines()

    @property
    def fpt(self) -> flops.FlopsPerToken:
        return flops.flops_per_token(self.config.model)

    @property
    def tokens_per_step(self) -> int:
        return self.config.tokens_per_step()

    @property
    def steps_per_hour(self) -> float:
        return self.tokens_per_s * 3600 / self.tokens_per_step

    @property
    def hours(self) -> float:
        return self.steps / self.steps_per_hour

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def mfu(self, flops_per_token: int) -> float | None:
        return self.tokens_per_s * flops_per_token / (self.peak_tflops * 1e12 * self.n_gpus) \
            if self.peak_tflops else None

    def compute_usd(self, hours: float | None = None) -> float:
        return ((self.hours if hours is None else hours) + self.setup_hours) * self.rate_usd_per_hr

    def total_usd(self, hours: float | None = None, buffer: bool = True) -> float:
        return self.compute_usd(hours) + self.lines.fixed + (self.lines.buffer_usd if buffer else 0.0)

    @property
    def fits_time(self) -> bool:
        return self.hours <= self.max_hours + 1e-9

    @property
    def fits_cap(self) -> bool:
        return self.total_usd() <= self.cap_usd + 1e-9

    def hours_for_cap(self, buffer: bool = True) -> float:
        """Training hours the cap pays for, after the fixed lines (and the buffer)."""
        money = self.cap_usd - self.lines.fixed - (self.lines.buffer_usd if buffer else 0.0)
        return max(0.0, money / self.rate_usd_per_hr - self.setup_hours)

    def steps_in(self, hours: float) -> int:
        return math.floor(hours * self.steps_per_hour + 1e-9)


def make_plan(cfg: C.Config, gpu: str | None, rate: float, *, hours: float | None = None, steps: int | None = None,
              mfu: float = 0.48, tokens_per_s: float | None = None, n_gpus: int = 1, cap_usd: float = 35.0,
              max_hours: float = 24.0, setup_hours: float = 0.0, peak_tflops: float | None = None,
              lines: Lines = Lines()) -> Plan:
    problems = []
    if rate <= 0:
        problems.append(f"--rate-usd-per-hr {rate} must be positive")
    if not 0 < mfu <= 1:
        problems.append(f"--mfu {mfu} must be in (0, 1]")
    if tokens_per_s is not None and tokens_per_s <= 0:
        problems.append(f"--tokens-per-s {tokens_per_s} must be positive")
    if (hours is not None and hours <= 0) or (steps is not None and steps <= 0) or n_gpus < 1 or setup_hours < 0:
        problems.append("--hours, --total-steps and --num-gpus must be positive (and --setup-hours >= 0)")
    if problems:
        raise X1Error("; ".join(problems))
    peak = peak_tflops if peak_tflops is not None else (gpu_peak(gpu) if gpu else None)
    measured = tokens_per_s is not None
    if tokens_per_s is None:
        if peak is None:
            raise X1Error(f"--gpu is needed to turn --mfu into tokens/s (choices: {', '.join(GPUS)}), "
                          "or give a measured --tokens-per-s")
        tokens_per_s = mfu * peak * 1e12 * n_gpus / flops.flops_per_token(cfg.model).honest
    plan = Plan(cfg, gpu or "an unnamed GPU", n_gpus, peak, rate, tokens_per_s, measured,
                cfg.train.total_steps, cap_usd, max_hours, setup_hours, lines)
    if steps is not None:
        return replace(plan, steps=steps)
    if hours is not None:
        return replace(plan, steps=plan.steps_in(hours))
    return plan


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
    where = f"{plan.n_gpus}x {plan.gpu}" + (f" ({plan.peak_tflops:g} TFLOP/s bf16 dense each)" if plan.peak_tflops
                                            else " (peak unknown: no MFU)")
    out = [f"plan: {config_path} on {where} at {_usd(plan.rate_usd_per_hr)}/h", "", "model"]
    out.append(f"  parameters   {counts.non_embedding:>12,} non-embedding (N in the Chinchilla convention)")
    out.append(f"             + {counts.embedding:>12,} embedding (= the tied LM head)")
    out.append(f"             = {counts.total:>12,} (+{counts.norm_gains:,} RMSNorm gains)")
    out.append(f"  FLOPs/token  {fpt.honest:.3e} honest = 6N {fpt.matmul_non_embedding:.3e} + LM head "
               f"{fpt.lm_head:.3e} + attention {fpt.attention:.3e}")
    out.append(f"               {fpt.lab_6n:.3e} the lab's 6N figure (leaves out the LM head and attention: "
               f"{1 - fpt.lab_6n / fpt.honest:.0%} of the real cost)")
    mfu, mfu6 = plan.mfu(fpt.honest), plan.mfu(fpt.lab_6n)
    if plan.measured:
        implied = f": MFU {mfu:.3f} honest ({mfu6:.3f} in the lab's 6N accounting)" if mfu else ""
        out += ["", f"throughput {plan.tokens_per_s:,.0f} tokens/s measured{implied}"]
    else:
        out += ["", f"throughput at MFU {mfu:.2f} (assumed; --tokens-per-s to use a measured figure)",
                f"  tokens/s     {plan.tokens_per_s:,.0f} (the lab's 6N accounting would claim "
                f"{plan.tokens_per_s * fpt.honest / fpt.lab_6n:,.0f} at the same MFU: ERRATA 1)"]
    out.append(f"  steps/hour   {plan.steps_per_hour:,.1f} of {plan.tokens_per_step:,} tokens")
    out += ["", f"run: {plan.steps:,} steps = {_b(plan.tokens)} tokens ({steps_source})",
            f"  time         {plan.hours:,.1f} h of training"]
    billed = f"({plan.hours:,.1f} h + {plan.setup_hours:g} h set-up)" if plan.setup_hours else f"{plan.hours:,.1f} h"
    rows = [(f"compute ({billed} x {_usd(plan.rate_usd_per_hr)}/h)", plan.compute_usd()),
            ("storage egress", plan.lines.egress_usd), ("persistent disk", plan.lines.disk_usd),
            ("buffer (1 restart)", plan.lines.buffer_usd), ("total", plan.total_usd())]
    out += ["", "cost"] + [f"  {name:<38}{_usd(v):>10}" for name, v in rows]
    out.append(f"  {'cap':<38}{_usd(plan.cap_usd):>10}")
    if not plan.setup_hours:
        out.append("  (the lab's table bills ~26 h for 24 h of training: --setup-hours 2 counts set-up and tokenizing)")
    out += ["", verdict(plan), "", *what_fits(plan), "", *chinchilla_lines(plan, counts)]
    return "\n".join(out)


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
    out = [f"what fits at {how} on {plan.gpu}:",
           f"  in {plan.max_hours:g} h: {plan.steps_in(plan.max_hours):,} steps = "
           f"{_b(plan.steps_in(plan.max_hours) * plan.tokens_per_step)} tokens, "
           f"{_usd(plan.total_usd(plan.max_hours))} in all",
           f"  under the {_usd(plan.cap_usd)} cap, keeping the buffer: {cap_h:,.1f} h = {plan.steps_in(cap_h):,} steps"]
    if both_h <= 0:
        return [*out, "  nothing fits: the fixed lines and the buffer alone exceed the cap"]
    best = plan.steps_in(both_h)
    rounded = best // 100 * 100 if best >= 100 else best
    hrs = rounded / plan.steps_per_hour
    out.append(f"  the largest run inside both: --total-steps {rounded} ({_b(rounded * plan.tokens_per_step)} "
               f"tokens, {hrs:,.1f} h, {_usd(plan.total_usd(hrs))} in all)")
    if not plan.fits_time:
        need = plan.steps * plan.tokens_per_step / (plan.max_hours * 3600)
        line = f"  {plan.steps:,} steps in {plan.max_hours:g} h would need {need:,.0f} tokens/s"
        if plan.peak_tflops:
            here = need * plan.fpt.honest / (plan.peak_tflops * 1e12 * plan.n_gpus)
            line += f": MFU {here:.2f} on {plan.gpu}" + (" (out of reach)" if here > 0.7 else "")
        other = _fastest_other(plan.peak_tflops)
        if other:
            line += f", MFU {need * plan.fpt.honest / (other[1] * 1e12 * plan.n_gpus):.2f} on {other[0]} " \
                    f"({other[1]:g} TFLOP/s)"
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m x1_pretrain.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, type=Path, help="the run's YAML config")
    p.add_argument("--gpu", help=f"one of {', '.join(GPUS)}")
    p.add_argument("--rate-usd-per-hr", required=True, type=float, help="the instance's price per hour")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--hours", type=float, help="plan this many hours of training")
    size.add_argument("--total-steps", type=int, help="plan this many optimizer steps (default: the config's)")
    speed = p.add_mutually_exclusive_group()
    speed.add_argument("--mfu", type=float, default=0.48, help="assumed MFU, honest accounting (default 0.48)")
    speed.add_argument("--tokens-per-s", type=float, help="a measured throughput instead of an assumed MFU")
    p.add_argument("--num-gpus", type=int, default=1, help="GPUs in the instance (the rate is for all of them)")
    p.add_argument("--peak-tflops", type=float, help="bf16 peak per GPU, for a GPU not in the table")
    p.add_argument("--budget-cap-usd", type=float, default=35.0, help="the hard cap (default: the lab's 35)")
    p.add_argument("--max-hours", type=float, default=24.0, help="the time window (default: the lab's 24 h)")
    p.add_argument("--setup-hours", type=float, default=0.0, help="billed hours outside training (default 0)")
    p.add_argument("--egress-usd", type=float, default=1.0, help="storage egress line (default $1)")
    p.add_argument("--disk-usd", type=float, default=2.0, help="persistent disk line (default $2)")
    p.add_argument("--buffer-usd", type=float, default=5.0, help="buffer for one restart (default $5)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = C.load(args.config)
        plan = make_plan(cfg, args.gpu, args.rate_usd_per_hr, hours=args.hours, steps=args.total_steps,
                         mfu=args.mfu, tokens_per_s=args.tokens_per_s, n_gpus=args.num_gpus,
                         cap_usd=args.budget_cap_usd, max_hours=args.max_hours, setup_hours=args.setup_hours,
                         peak_tflops=args.peak_tflops, lines=Lines(args.egress_usd, args.disk_usd, args.buffer_usd))
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    source = ("--total-steps" if args.total_steps else f"{args.hours:g} h" if args.hours
              else "train.total_steps in the config")
    print(render(plan, str(args.config), source))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
