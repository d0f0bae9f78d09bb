"""Will the run fit? The plan of a config on a GPU: throughput (assumed MFU or measured), hours, tokens and
the bill's lines against the cap. ``plan.py`` is the command; ``plan_text.py`` renders it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..core import config as C
from ..core.errors import X1Error
from ..model import flops
from .money import DEFAULT_MFU, DEFAULT_RESERVE_MIN, EvalCost, Lines, Money, steps_that_fit

# --gpu name -> (key of flops.PEAK_TFLOPS_BF16, memory in GB). Dense bf16 peaks, SXM parts for H100/H200.
GPUS: dict[str, tuple[str, int]] = {
    "a100-80gb": ("a100", 80),
    "a100-40gb": ("a100", 40),
    "h100": ("h100 sxm", 80),
    "h100-pcie": ("h100 pcie", 80),
    "h100-nvl": ("h100 nvl", 94),
    "h200": ("h200", 141),
    "h800": ("h800 sxm", 80),
    "l40s": ("l40s", 48),
    "a10g": ("a10g", 24),
    "l4": ("l4", 24),
    "rtx4090": ("rtx 4090", 24),
    "rtx3090": ("rtx 3090", 24),
    "v100": ("v100", 32),
}
# Hoffmann et al. 2022 ("Chinchilla"), approach 3: L(N, D) = E + A / N^alpha + B / D^beta.
CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def chinchilla_loss(n_params: float, n_tokens: float) -> float:
    c = CHINCHILLA
    return c["E"] + c["A"] / n_params ** c["alpha"] + c["B"] / n_tokens ** c["beta"]


def gpu_peak(name: str) -> float:
    key = name.lower()
    if key not in GPUS:
        raise X1Error(
            f"--gpu {name!r} is not in the table; choose one of {', '.join(GPUS)} "
            "(or give --peak-tflops for another GPU)"
        )
    return flops.PEAK_TFLOPS_BF16[GPUS[key][0]]


@dataclass(frozen=True)
class Plan:
    config: C.Config
    gpu: str
    n_gpus: int
    peak_tflops: float | None  # per device
    rate_usd_per_hr: float  # the whole instance
    tokens_per_s: float
    measured: bool  # tokens/s measured (True) or from an assumed MFU
    steps: int
    cap_usd: float
    max_hours: float  # the run's time window (the lab's: 24 h)
    setup_hours: float = 0.0  # billed hours outside training before the first step (set-up, tokenization)
    lines: Lines = field(default_factory=Lines)
    reserve_min: float = DEFAULT_RESERVE_MIN  # final checkpoint, export and shutdown after the last step
    evals: EvalCost = field(default_factory=EvalCost)  # the task evaluations (train.eval_tasks): periodic and final

    @property
    def money(self) -> Money:
        """The plan in the one planner's terms (budget/money.py): nothing spent yet; the reserve holds the task
        evaluation at the end too."""
        return Money(
            self.cap_usd,
            self.rate_usd_per_hr,
            lines=self.lines,
            setup_hours=self.setup_hours,
            reserve_min=self.reserve_min + self.final_eval_s / 60,
        )

    @property
    def train_step_s(self) -> float:
        return self.tokens_per_step / self.tokens_per_s

    @property
    def eval_s(self) -> float:
        """Seconds of one task evaluation (0 without train.eval_tasks)."""
        return self.evals.per_eval_s(self.train_step_s)

    @property
    def final_eval_s(self) -> float:
        """What the reserve holds for the evaluation at the end (its time cap: none has been timed)."""
        return self.evals.final_s(self.train_step_s)

    @property
    def step_s(self) -> float:
        """A step's wall time with its share of the periodic task evaluations."""
        return self.train_step_s + self.evals.per_step_s(self.train_step_s)

    @property
    def fpt(self) -> flops.FlopsPerToken:
        return flops.flops_per_token(self.config.model)

    @property
    def tokens_per_step(self) -> int:
        return self.config.tokens_per_step()

    @property
    def steps_per_hour(self) -> float:
        return 3600 / self.step_s

    @property
    def hours(self) -> float:
        return self.steps / self.steps_per_hour

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def mfu(self, flops_per_token: int) -> float | None:
        return (
            self.tokens_per_s * flops_per_token / (self.peak_tflops * 1e12 * self.n_gpus) if self.peak_tflops else None
        )

    def compute_usd(self, hours: float | None = None) -> float:
        return ((self.hours if hours is None else hours) + self.setup_hours) * self.rate_usd_per_hr

    @property
    def reserve_usd(self) -> float:
        """The final checkpoint, export and shutdown (the task evaluation at the end is ``final_eval_usd``)."""
        return self.reserve_min / 60 * self.rate_usd_per_hr

    @property
    def final_eval_usd(self) -> float:
        return self.final_eval_s / 3600 * self.rate_usd_per_hr

    def total_usd(self, hours: float | None = None, buffer: bool = True) -> float:
        return self.money.total_usd(self.hours if hours is None else hours, buffer)

    @property
    def fits_time(self) -> bool:
        return self.hours <= self.max_hours + 1e-9

    @property
    def fits_cap(self) -> bool:
        return self.total_usd() <= self.cap_usd + 1e-9

    def hours_for_cap(self, buffer: bool = True) -> float:
        """Training hours the cap pays for, after the fixed lines, set-up, the reserve (and the buffer)."""
        return self.money.training_hours_that_fit(buffer)

    def steps_in(self, hours: float) -> int:
        return math.floor(hours * self.steps_per_hour + 1e-9)

    def steps_that_fit(self) -> int:
        """The largest run inside both the cap (keeping the buffer) and the time window."""
        return steps_that_fit(self.money, self.step_s, self.max_hours)


@dataclass(frozen=True)
class Ask:
    """What the user asks the planner for (the plan command's flags)."""

    hours: float | None = None  # plan this many hours of training ...
    steps: int | None = None  # ... or this many optimizer steps (default: the config's)
    mfu: float = DEFAULT_MFU  # assumed MFU, honest accounting ...
    tokens_per_s: float | None = None  # ... unless a measured throughput is given
    n_gpus: int = 1
    cap_usd: float = 35.0
    max_hours: float = 24.0
    setup_hours: float = 0.0
    peak_tflops: float | None = None  # per GPU, for a GPU not in the table
    lines: Lines = field(default_factory=Lines)
    reserve_min: float = DEFAULT_RESERVE_MIN
    evals: EvalCost = field(default_factory=EvalCost)


def make_plan(cfg: C.Config, gpu: str | None, rate: float, ask: Ask = Ask()) -> Plan:
    hours, steps, mfu, tokens_per_s, n_gpus = ask.hours, ask.steps, ask.mfu, ask.tokens_per_s, ask.n_gpus
    setup_hours, peak_tflops = ask.setup_hours, ask.peak_tflops
    problems = []
    if rate <= 0:
        problems.append(f"--rate-usd-per-hr {rate} must be positive")
    if not 0 < mfu <= 1:
        problems.append(f"--budget-assumed-mfu {mfu} must be in (0, 1]")
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
            raise X1Error(
                f"--gpu is needed to turn --budget-assumed-mfu into tokens/s (choices: {', '.join(GPUS)}), "
                "or give a measured --tokens-per-s"
            )
        tokens_per_s = mfu * peak * 1e12 * n_gpus / flops.flops_per_token(cfg.model).honest
    plan = Plan(
        cfg,
        gpu or "an unnamed GPU",
        n_gpus,
        peak,
        rate,
        tokens_per_s,
        measured,
        cfg.train.total_steps,
        ask.cap_usd,
        ask.max_hours,
        setup_hours,
        ask.lines,
        ask.reserve_min,
        ask.evals,
    )
    if steps is not None:
        return replace(plan, steps=steps)
    if hours is not None:
        return replace(plan, steps=plan.steps_in(hours))
    return plan
