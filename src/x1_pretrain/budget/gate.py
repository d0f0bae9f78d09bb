"""Before training: the launch gate (refuse an expensive rate or a plan over the cap) and
``--dry-run-budget`` (check every part the guard needs and send a test alert)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from ..core import redact
from ..core.contract import EXIT_BUDGET_CHECKPOINT
from .guard import Decision, Limits, Memory, Progress, Reading, Snapshot, decide
from .money import Money, steps_that_fit
from .source import read_source


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """The run the user is about to pay for."""

    total_steps: int
    steps_done: int
    step_s: float | None  # expected seconds per optimizer step (None: unknown)
    resumed: bool = False  # a relaunch: the hint must name --allow-config-change
    fit: bool = False  # total_steps is an upper bound; the end follows the money

    @property
    def hours_left(self) -> float | None:
        if self.step_s is None:
            return None
        return max(self.total_steps - self.steps_done, 0) * self.step_s / 3600


def as_the_guard_sees_it(reading: Reading, limits: Limits, memory: Memory, now: datetime | None = None) -> Reading:
    """The reading with the spend the guard and the watchdog use: aged to ``now`` and never below the ledger's
    (``memory``), so the gate decides on the same number as the other two lines. An unreadable reading stays
    as it is (the guard's unknown-spend rules apply once training starts)."""
    snap = reading.snapshot
    if snap is None:
        return reading
    now = now or datetime.now(timezone.utc)
    decision, _ = decide(reading, limits, now, Progress(0, 0, None), memory)
    if decision.spent_usd is None or decision.spent_usd <= snap.spent_usd:
        return reading
    return Reading(replace(snap, spent_usd=decision.spent_usd), reading.problem)


def money_at(snapshot: Snapshot, limits: Limits) -> Money:
    """Where the money stands at launch, in the one planner's terms (budget/money.py)."""
    return Money(
        limits.cap_usd,
        snapshot.rate_usd_per_hr,
        lines=limits.lines,
        spent_usd=snapshot.spent_usd,
        fixed_in_spent=snapshot.fixed_usd is not None,
        reserve_min=limits.reserve_min,
    )


def planned_total(snapshot: Snapshot, plan: LaunchPlan, limits: Limits) -> float | None:
    """The whole bill of the planned run, buffer kept (as ``plan`` prints it)."""
    h = plan.hours_left
    return None if h is None else money_at(snapshot, limits).total_usd(h)


def fitting_steps(snapshot: Snapshot, plan: LaunchPlan, limits: Limits) -> int | None:
    """Steps in all (done + to come) that fit under the cap with the buffer kept; the number ``plan`` prints."""
    if plan.step_s is None or snapshot.rate_usd_per_hr <= 0:
        return None
    return plan.steps_done + steps_that_fit(money_at(snapshot, limits), plan.step_s)


def expectation(reading: Reading, plan: LaunchPlan, limits: Limits) -> str | None:
    """With --budget-fit: what the run expects to reach at launch (None when unknown)."""
    snap = reading.snapshot
    fit = fitting_steps(snap, plan, limits) if snap is not None else None
    if snap is None or fit is None:
        return None
    end = min(fit, plan.total_steps)
    cost = money_at(snap, limits).total_usd(max(end - plan.steps_done, 0) * (plan.step_s or 0.0) / 3600)
    return (
        f"--budget-fit: expect to reach about step {end:,} of at most {plan.total_steps:,} "
        f"(${cost:.2f} in all with the ${limits.lines.buffer_usd:.2f} buffer; the end follows the money "
        "at every check)"
    )


def gate_problems(reading: Reading, plan: LaunchPlan, limits: Limits, max_rate: float) -> list[str]:
    """Reasons not to start at all (each with what to do instead); empty when launching is fine."""
    snap = reading.snapshot
    if snap is None:
        return []
    out = []
    if snap.rate_usd_per_hr > max_rate:
        out.append(
            f"the rate is ${snap.rate_usd_per_hr:.2f}/h, above --budget-max-rate-usd-per-hr ${max_rate:.2f}: "
            "do not launch; wait 4 hours and check again (RunPod community at ~$0.79/h is an acceptable "
            "fallback), or --force-launch"
        )
    total = planned_total(snap, plan, limits)
    if plan.fit:
        fit = fitting_steps(snap, plan, limits)
        if fit is not None and fit <= plan.steps_done:
            out.append(
                f"--budget-fit: not even one more step fits (spent ${snap.spent_usd:.2f} of "
                f"${limits.cap_usd:.2f}, with the reserve, fixed lines and the ${limits.lines.buffer_usd:.2f} "
                "buffer); raise the cap or --force-launch"
            )
        return out
    if total is not None and total > limits.cap_usd:
        fit = fitting_steps(snap, plan, limits)
        again = " --allow-config-change" if plan.resumed else ""  # a resume refuses a changed config without it
        ended = " (this run now ends at its last checkpoint: final.safetensors is written)" if plan.resumed else ""
        out.append(
            f"the planned run costs about ${total:.2f} in all (spent ${snap.spent_usd:.2f} + "
            f"{plan.total_steps - plan.steps_done:,} steps x {plan.step_s:.2f} s x "
            f"${snap.rate_usd_per_hr:.2f}/h + reserve, fixed lines and the ${limits.lines.buffer_usd:.2f} "
            f"buffer), over the cap ${limits.cap_usd:.2f}; about {fit:,} steps in all fit: relaunch with "
            f"--total-steps {fit}{again}, or --budget-fit{again} (optim.schedule wsd) to end the schedule "
            f"where the money ends, or --force-launch{ended}"
        )
    return out


def _show(d: Decision) -> str:
    return f"{d.action.value} ({d.reason})"


def dry_run(
    source: str,
    limits: Limits,
    plan: LaunchPlan,
    max_rate: float,
    alerter: Any,
    log: Callable[[str], None],
    now: datetime | None = None,
) -> int:
    """Check everything the real run needs; send a test alert. 0 only when all is in place."""
    now = now or datetime.now(timezone.utc)
    failures: list[str] = []
    reading = read_source(source)
    snap = reading.snapshot
    if snap is None:
        failures.append(f"budget source: {reading.problem}")
        log(f"budget source {redact.url(source)}: FAIL ({reading.problem})")
    else:
        age_min = (now - snap.last_update_utc).total_seconds() / 60
        fresh = -2 <= age_min <= limits.stale_after_intervals * limits.sidecar_interval_min
        log(
            f"budget source {redact.url(source)}: spent ${snap.spent_usd:.2f}, rate ${snap.rate_usd_per_hr:.2f}/h, "
            f"projected ${snap.projected_total_usd:.2f}, updated {age_min:.1f} min ago: {'OK' if fresh else 'FAIL'}"
        )
        if not fresh:
            failures.append(f"budget source: the reading is {age_min:.1f} min old; is the sidecar polling?")
        total = planned_total(snap, plan, limits)
        if total is None:
            failures.append(
                "plan: the expected step time is unknown; pass --budget-expected-step-s (measure it, e.g. "
                "with bench/gpu_check.sh) so the cost of the run can be checked"
            )
            log("plan: step time unknown: FAIL")
        elif plan.fit:
            log(f"plan: {expectation(reading, plan, limits)}: OK")
        else:
            log(
                f"plan: {plan.total_steps - plan.steps_done:,} steps x {plan.step_s:.2f} s = {plan.hours_left:.1f} h "
                f"x ${snap.rate_usd_per_hr:.2f}/h, with spent ${snap.spent_usd:.2f}, reserve, fixed lines and buffer: "
                f"${total:.2f} of cap ${limits.cap_usd:.2f}: {'OK' if total <= limits.cap_usd else 'FAIL'} "
                f"(about {fitting_steps(snap, plan, limits):,} steps fit)"
            )
        for problem in gate_problems(reading, plan, limits, max_rate):
            failures.append(f"launch gate: {problem}")
        # What the guard would do now and at each threshold, for this plan.
        base = Progress(plan.steps_done, plan.total_steps, 3600 / plan.step_s if plan.step_s else None)
        fresh_snap = Snapshot(
            snap.spent_usd,
            snap.rate_usd_per_hr,
            snap.hours_elapsed,
            snap.projected_total_usd,
            now - timedelta(minutes=1),
            snap.fixed_usd,
        )

        def at(spent: float, projected: float) -> Snapshot:
            return Snapshot(spent, snap.rate_usd_per_hr, 0.0, projected, fresh_snap.last_update_utc)

        done = Progress(plan.total_steps, plan.total_steps, None)
        a, c = limits.alert_usd + 0.01, limits.cap_usd + 0.01
        cases = [
            ("now", fresh_snap, base),
            (f"spent ${a:.2f}", at(a, a), done),
            (f"projected ${c:.2f}", at(limits.alert_usd - 1, c), done),
            (f"spent ${c:.2f}", at(c, c), done),
        ]
        for label, s, prog in cases:
            d, _ = decide(Reading(s), limits, now, prog, Memory())
            log(f"guard at {label}: {_show(d)}")
    channels = list(alerter.channels()) if alerter is not None else []
    if not channels:
        failures.append(
            "alerts: no channel configured; set X1_SLACK_WEBHOOK_URL and/or X1_SMTP_HOST, X1_SMTP_FROM, "
            "X1_SMTP_TO (see README)"
        )
        log("test alert: no channel configured: FAIL")
    else:
        results = alerter.send(
            "x1 budget guard: test alert",
            "This is a test of the x1 budget alerts "
            f"(cap ${limits.cap_usd:.2f}, alert line ${limits.alert_usd:.2f}). No action needed.",
            test=True,
        )
        for name, err in results.items():
            log(f"test alert via {name}: {'OK' if err is None else 'FAIL (' + err + ')'}")
            if err is not None:
                failures.append(f"alerts: {name} failed ({err})")
    if failures:
        log(f"dry run: NOT READY ({len(failures)} problem(s)):")
        for f in failures:
            log(f"  - {f}")
        return EXIT_BUDGET_CHECKPOINT
    log("dry run: READY: everything the budget guard needs is in place")
    return 0


def expected_step_s(
    explicit: float | None, tokens_per_step: int, flops_per_token: int, peak_tflops: float | None, assumed_mfu: float
) -> float | None:
    """The user's measured step time, else one derived from the device's peak at an assumed MFU."""
    if explicit is not None:
        return explicit
    if not peak_tflops or assumed_mfu <= 0 or not math.isfinite(assumed_mfu):
        return None
    return tokens_per_step * flops_per_token / (peak_tflops * 1e12 * assumed_mfu)
