"""The budget guard: a pure decision from (budget reading, limits, now, progress, memory) to an action.

The memory is the cost ledger's content (``budget/ledger.py`` keeps it on disk across processes), so every
rule below holds across restarts and relaunches.

Spend (what the rules compare with the cap) is an estimate that never decreases:

* a reading is aged: ``spent + rate × (now − last_update)``, so a reading a few minutes old still counts the
  minutes since (readings are never "fresh enough" to skip this);
* the memory is aged the same way with the newest trusted rate, and the larger of the two is the spend: a
  reading below the memory (a sidecar restarted from zero, a rate change that rewrote the past, a pod
  restart) is a warning and an alert, never a lower number;
* a rate ≤ 0, a rate far from the launch rate (``rate_tolerance``) and a jump larger than the rate allows
  are flagged (warning + one alert each); a rate ≤ 0 is never used to age anything.
* spend across machines adds up: a reading names its machine (the provider's instance id, else the sidecar's
  start), and when a run moves to another machine (a lost spot instance, a resume elsewhere) the compute counted
  on the earlier ones is kept (``Memory.earlier_usd``) and this machine's reading is added to it: the total the
  cap guards is their sum, the fixed lines counted once. The earlier machine's bill is what was counted at its
  last check: the minutes between that check and its end are not seen (at most one ``check_every_min``). After
  a move the sidecar's ``projected_total_usd`` (one machine's planned hours) is not used: the guard's own
  projection from the steps left is.

Rules (exit-now wins over checkpoint-and-exit, which wins over alert):

* spend above the cap → EXIT_NOW (exit 4, no checkpoint: the money is already gone);
* projected total above the cap → CHECKPOINT_AND_EXIT (exit 3). The projection is the larger of the
  sidecar's ``projected_total_usd`` (aged like the spend) and the guard's own: spend + rate × (the remaining
  steps at the measured speed + the reserve for the final checkpoint, export and shutdown);
* spend above the alert line → ALERT (email + Slack), once per crossing; training carries on;
* faults never pass silently and never crash the run: an unreadable, invalid or future-dated reading → the
  memory is aged at its rate and an alert is sent once. When no valid reading younger than
  ``unknown_grace_min`` exists (counted across processes), the spend is unknown → CHECKPOINT_AND_EXIT:
  unknown spend is not safe spend (but a memory already over the cap still means EXIT_NOW).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any

from .money import DEFAULT_RESERVE_MIN, Lines, Money

FIELDS = ("spent_usd", "rate_usd_per_hr", "hours_elapsed", "projected_total_usd", "last_update_utc")
FUTURE_TOLERANCE = timedelta(minutes=2)
DOWN_TOLERANCE_USD = 0.01  # readings this close below the memory are rounding, not a fall
JUMP_SLACK_USD = 0.50  # a rise this small is never called a jump
STALE_AFTER_INTERVALS = 3.0  # a reading older than this many sidecar intervals is stale (warned, aged)


class Action(str, Enum):
    CONTINUE = "continue"
    ALERT = "alert"
    CHECKPOINT_AND_EXIT = "checkpoint-and-exit"
    EXIT_NOW = "exit-now"


def format_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Snapshot:
    spent_usd: float
    rate_usd_per_hr: float
    hours_elapsed: float
    projected_total_usd: float
    last_update_utc: datetime
    fixed_usd: float | None = None  # the fixed lines spent_usd already carries (None: an older sidecar)
    machine: str | None = None  # which machine's bill: "provider:instance id" or "provider:started <utc>"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "spent_usd": self.spent_usd,
            "rate_usd_per_hr": self.rate_usd_per_hr,
            "hours_elapsed": self.hours_elapsed,
            "projected_total_usd": self.projected_total_usd,
            "last_update_utc": format_time(self.last_update_utc),
        }
        if self.fixed_usd is not None:
            out["fixed_usd"] = self.fixed_usd
        if self.machine is not None:
            out["machine"] = self.machine
        return out


@dataclass(frozen=True)
class Reading:
    """What the budget source gave: a valid snapshot, or the problem with it."""

    snapshot: Snapshot | None
    problem: str | None = None


@dataclass(frozen=True)
class Limits:
    cap_usd: float
    alert_usd: float
    sidecar_interval_min: float = 5.0
    stale_after_intervals: float = STALE_AFTER_INTERVALS
    unknown_grace_min: float = 60.0
    rate_tolerance: float = 2.0  # a rate above x2 or below /2 of the launch rate is flagged
    lines: Lines = field(default_factory=Lines)  # added to projections when a reading does not carry its fixed lines
    reserve_min: float = DEFAULT_RESERVE_MIN  # final checkpoint, export and shutdown, after the last step


@dataclass(frozen=True)
class Progress:
    steps_done: int
    total_steps: int
    steps_per_hour: float | None  # measured in this process; None before enough steps
    final_checkpoint_s: float = 0.0  # the reserve: final checkpoint, export and shutdown
    final_eval_s: float = 0.0  # ... and the task evaluation at the end (train.eval_tasks)


@dataclass(frozen=True)
class Memory:
    """What the guard carries from one check to the next (passed in and returned: decide stays pure).
    ``budget/ledger.py`` stores it as ``<ckpt-dir>/budget_ledger.json``."""

    last_good: Snapshot | None = None
    alerted: frozenset[str] = field(default_factory=frozenset)
    unknown_since: datetime | None = None  # first check that found no usable reading at all
    spent_usd: float | None = None  # the spend used at the last check (never decreases)
    spent_at: datetime | None = None  # when that check was
    rate_usd_per_hr: float | None = None  # the newest trusted (positive) rate: ages the spend
    launch_rate_usd_per_hr: float | None = None
    machine: str | None = None  # the machine whose readings the spend follows now
    earlier_usd: float = 0.0  # compute billed on the run's other machines (in spent_usd too)
    machines: tuple[tuple[str, float], ...] = ()  # (machine, its compute bill) of each other machine

    def spend_at(self, now: datetime) -> float | None:
        """The memory's spend aged to ``now`` at its rate."""
        if self.spent_usd is None:
            return None
        if self.spent_at is None or not self.rate_usd_per_hr:
            return self.spent_usd
        return self.spent_usd + self.rate_usd_per_hr * _hours(now - self.spent_at)


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    spent_usd: float | None
    projected_usd: float | None
    own_projection_usd: float | None
    file_projection_usd: float | None
    alerts: tuple[str, ...] = ()  # messages to send now (each fires once per crossing)
    warnings: tuple[str, ...] = ()  # faults to log now
    rate_usd_per_hr: float | None = None  # the rate the estimate ages at
    cause: str = ""  # why it stops: "cap" (spent), "projection" or "unknown"; "" otherwise


def _hours(d: timedelta) -> float:
    return max(d.total_seconds() / 3600, 0.0)


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def parse(data: Any) -> Reading:
    """Validate a decoded budget.json."""
    if not isinstance(data, dict):
        return Reading(None, "budget.json is not a JSON object")
    missing = [k for k in FIELDS if k not in data]
    if missing:
        return Reading(None, f"budget.json lacks {', '.join(missing)}")
    nums: dict[str, float] = {}
    for k in FIELDS[:4]:
        v = data[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return Reading(None, f"budget.json {k} is {v!r}, not a number")
        if not math.isfinite(v):
            return Reading(None, f"budget.json {k} is {v}, not a finite number")
        if v < 0:
            return Reading(None, f"budget.json {k} is negative ({v})")
        nums[k] = float(v)
    t = parse_time(data["last_update_utc"])
    if t is None:
        return Reading(None, f"budget.json last_update_utc {data['last_update_utc']!r} is not an ISO-8601 time")
    return Reading(
        Snapshot(
            nums["spent_usd"],
            nums["rate_usd_per_hr"],
            nums["hours_elapsed"],
            nums["projected_total_usd"],
            t,
            _fixed(data.get("fixed_usd")),
            machine_of(data),
        )
    )


def machine_of(data: dict[str, Any]) -> str | None:
    """Which machine a budget.json bills: the provider's instance id, else the sidecar's billing start (one
    sidecar per machine); None for a sidecar that says neither (an older one: one machine is assumed)."""
    if isinstance(data.get("machine"), str):
        return str(data["machine"])
    provider, rid, started = data.get("provider"), data.get("resource_id"), data.get("started_utc")
    provider = provider if isinstance(provider, str) and provider else "unknown"
    if isinstance(rid, str) and rid and rid != provider:
        return f"{provider}:{rid}"
    if isinstance(started, str) and started:
        return f"{provider}:started {started}"
    return None


def _fixed(value: Any) -> float | None:
    """budget.json's fixed lines: {"disk_usd": 2, "egress_usd": 1} (or a plain total), else None."""
    if isinstance(value, dict):
        parts = [v for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return float(sum(parts)) if parts and all(math.isfinite(v) and v >= 0 for v in parts) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


class _Notes:
    """Alerts and warnings of one decision; an alert fires once per crossing (keys kept in the memory)."""

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.alerts: list[str] = []
        self.warnings: list[str] = []

    def once(self, key: str, message: str, warn: bool = True) -> None:
        if warn:
            self.warnings.append(message)
        if key not in self.memory.alerted:
            self.alerts.append(message)
            self.memory = replace(self.memory, alerted=self.memory.alerted | {key})

    def rearm(self, *keys: str) -> None:
        self.memory = replace(self.memory, alerted=self.memory.alerted - set(keys))


def _check_rate(snap: Snapshot, limits: Limits, notes: _Notes) -> float | None:
    """The reading's rate if it can be trusted for ageing, else None (flagged)."""
    rate, launch = snap.rate_usd_per_hr, notes.memory.launch_rate_usd_per_hr
    if rate <= 0:
        notes.once(
            "rate_zero",
            f"budget.json rate_usd_per_hr is {rate:g}: a running instance costs money; "
            "ageing the spend at the last trusted rate instead (check the sidecar)",
        )
        return None
    notes.rearm("rate_zero")
    if launch and not launch / limits.rate_tolerance <= rate <= launch * limits.rate_tolerance:
        notes.once(
            "rate_far",
            f"the rate ${rate:.2f}/h is far from the launch rate ${launch:.2f}/h (more than "
            f"x{limits.rate_tolerance:g} away): check the instance's price",
        )
    else:
        notes.rearm("rate_far")
    return rate


def _check_jump(snap: Snapshot, rate: float | None, notes: _Notes) -> None:
    prev = notes.memory.last_good
    if prev is None or snap.last_update_utc <= prev.last_update_utc:
        return
    fastest = max(
        r for r in (rate, notes.memory.rate_usd_per_hr, notes.memory.launch_rate_usd_per_hr, 0.0) if r is not None
    )
    allowed = fastest * _hours(snap.last_update_utc - prev.last_update_utc) * 1.5 + JUMP_SLACK_USD
    rise = snap.spent_usd - prev.spent_usd
    if rise > allowed:
        minutes = _hours(snap.last_update_utc - prev.last_update_utc) * 60
        notes.once(
            "jump",
            f"spend jumped by ${rise:.2f} in {minutes:.0f} min, more than ${fastest:.2f}/h allows "
            f"(${allowed:.2f}); taking the higher number",
        )
    else:
        notes.rearm("jump")


def _switch_machine(machine: str, notes: _Notes) -> None:
    """The run moved to ``machine``: what was counted so far, less the fixed lines (the new machine's reading
    carries them again), becomes the earlier machines' share."""
    m = notes.memory
    fixed = (m.last_good.fixed_usd or 0.0) if m.last_good else 0.0
    bills = dict(m.machines)
    bills[str(m.machine)] = round(max((m.spent_usd or 0.0) - m.earlier_usd - fixed, 0.0), 4)
    bills.pop(machine, None)  # back on a machine seen before: its own reading carries its whole bill
    earlier = sum(bills.values())
    notes.warnings.append(
        f"budget: the run is on another machine ({machine}; was {m.machine}): the "
        f"${earlier:.2f} of compute counted on the other machines is added to this machine's bill"
    )
    notes.memory = replace(
        m, machine=machine, earlier_usd=earlier, last_good=None, machines=tuple(sorted(bills.items()))
    )


def _accept(snap: Snapshot, limits: Limits, now: datetime, notes: _Notes) -> float:
    """Take a valid reading into the memory; returns the run's spend (earlier machines included) aged to ``now``."""
    rate = _check_rate(snap, limits, notes)
    _check_jump(snap, rate, notes)
    m = notes.memory
    trusted = rate or m.rate_usd_per_hr or m.launch_rate_usd_per_hr or 0.0
    aged = m.earlier_usd + snap.spent_usd + trusted * _hours(now - snap.last_update_utc)
    notes.memory = replace(
        m,
        last_good=snap,
        unknown_since=None,
        rate_usd_per_hr=trusted or None,
        launch_rate_usd_per_hr=m.launch_rate_usd_per_hr or rate,
    )
    return aged


def _no_reading(limits: Limits, now: datetime, notes: _Notes) -> str | None:
    """When no usable reading is young enough: why the spend is unknown (None while inside the grace)."""
    m = notes.memory
    if m.last_good is None:
        since = m.unknown_since or now
        notes.memory = replace(m, unknown_since=since)
        waited = _hours(now - since) * 60
        if waited > limits.unknown_grace_min:
            return f"no valid budget reading in {waited:.0f} min (grace {limits.unknown_grace_min:g} min)"
        notes.once(
            "unknown",
            f"spend unknown for {waited:.0f} min (no valid budget reading yet); stopping with a "
            f"checkpoint after {limits.unknown_grace_min:g} min without one",
        )
        return None
    age_min = _hours(now - m.last_good.last_update_utc) * 60
    if age_min > limits.unknown_grace_min:
        return f"the newest valid budget reading is {age_min:.0f} min old (grace {limits.unknown_grace_min:g} min)"
    return None


def decide(
    reading: Reading, limits: Limits, now: datetime, progress: Progress, memory: Memory
) -> tuple[Decision, Memory]:
    notes = _Notes(memory)
    snap = reading.snapshot
    if snap is not None and snap.last_update_utc - now > FUTURE_TOLERANCE:
        notes.once(
            "future",
            f"budget.json last_update_utc {format_time(snap.last_update_utc)} is in the future "
            f"(now {format_time(now)}); ignoring it (clock skew or a broken sidecar)",
        )
        snap = None
    elif snap is not None:
        notes.rearm("future")
    if reading.problem:
        notes.warnings.append(reading.problem)
        notes.once("unreadable", f"budget source problem: {reading.problem}", warn=False)
    elif snap is not None:
        notes.rearm("unreadable")
    prior = memory.spend_at(now)
    if (
        snap is not None
        and snap.machine
        and memory.machine
        and snap.machine != memory.machine
        and memory.spent_usd is not None
    ):
        prior = memory.spent_usd  # the earlier machine is gone: its bill is what was counted, not aged on
        _switch_machine(snap.machine, notes)
    elif snap is not None and snap.machine and not memory.machine:
        notes.memory = replace(notes.memory, machine=snap.machine)
    aged = _accept(snap, limits, now, notes) if snap is not None else None
    unknown = _no_reading(limits, now, notes)
    _stale(notes, limits, now)
    candidates = [x for x in (aged, prior) if x is not None]
    if not candidates:  # nothing known at all
        return _finish(notes, unknown, limits, now, progress, None, None)
    spent = max(candidates)
    if aged is not None and prior is not None and aged < prior - DOWN_TOLERANCE_USD:
        notes.once(
            "went_down",
            f"budget reading ${aged:.2f} (aged) is below the ${prior:.2f} already counted: "
            f"keeping ${prior:.2f} (a restarted sidecar or a rewritten past?)",
        )
    elif aged is not None:
        notes.rearm("went_down")
    notes.memory = replace(notes.memory, spent_usd=spent, spent_at=now)
    return _finish(notes, unknown, limits, now, progress, spent, aged)


def _stale(notes: _Notes, limits: Limits, now: datetime) -> None:
    basis = notes.memory.last_good
    if basis is None:
        return
    age_min = _hours(now - basis.last_update_utc) * 60
    stale_after = limits.stale_after_intervals * limits.sidecar_interval_min
    if age_min > stale_after:
        rate = notes.memory.rate_usd_per_hr or 0.0
        notes.once(
            "stale",
            f"budget reading is {age_min:.0f} min old (stale after {stale_after:g} min); ageing the "
            f"spend at ${rate:.2f}/h",
        )
    else:
        notes.rearm("stale")


def _finish(
    notes: _Notes,
    unknown: str | None,
    limits: Limits,
    now: datetime,
    progress: Progress,
    spent: float | None,
    aged: float | None,
) -> tuple[Decision, Memory]:
    m = notes.memory
    rate = m.rate_usd_per_hr
    if spent is not None and spent > limits.cap_usd:
        return _decision(
            notes,
            Action.EXIT_NOW,
            f"spent ${spent:.2f} is above the cap ${limits.cap_usd:.2f}: exiting now, without a checkpoint",
            spent,
            spent,
            None,
            None,
        )
    if unknown is not None:
        notes.once("unknown", f"spend unknown: {unknown}")
        return _decision(
            notes,
            Action.CHECKPOINT_AND_EXIT,
            f"spend unknown: {unknown}; unknown spend is not safe spend",
            spent,
            None,
            None,
            None,
        )
    if spent is None:
        msg = notes.alerts[-1] if notes.alerts else "spend unknown (no valid budget reading yet)"
        return _decision(notes, Action.ALERT if notes.alerts else Action.CONTINUE, msg, None, None, None, None)
    own = None
    if progress.steps_per_hour and progress.steps_per_hour > 0 and rate:
        remaining_h = max(progress.total_steps - progress.steps_done, 0) / progress.steps_per_hour
        own = money_now(limits, m, spent, progress).total_usd(remaining_h, buffer=False)
    # the sidecar's own projection (its planned hours from its start) is one machine's: after a move it would
    # count the earlier machines' hours again, so then only the guard's projection (steps left) counts
    file_proj = (
        m.last_good.projected_total_usd + (spent - m.last_good.spent_usd) if m.last_good and not m.machines else None
    )
    projected = max(x for x in (own, file_proj, spent) if x is not None)
    if projected > limits.cap_usd:
        return _decision(
            notes,
            Action.CHECKPOINT_AND_EXIT,
            f"projected total ${projected:.2f} is above the cap "
            f"${limits.cap_usd:.2f} (spent ${spent:.2f}): checkpoint and exit",
            spent,
            projected,
            own,
            file_proj,
        )
    if spent > limits.alert_usd:
        notes.once(
            "alert_line",
            f"spent ${spent:.2f} is above the alert line ${limits.alert_usd:.2f} (cap "
            f"${limits.cap_usd:.2f}, projected ${projected:.2f}); training continues",
            warn=False,
        )
    else:
        notes.rearm("alert_line")
    action = Action.ALERT if notes.alerts else Action.CONTINUE
    reason = (
        notes.alerts[-1] if notes.alerts else f"spent ${spent:.2f}, projected ${projected:.2f} of ${limits.cap_usd:.2f}"
    )
    return _decision(notes, action, reason, spent, projected, own, file_proj)


def money_now(limits: Limits, memory: Memory, spent: float, progress: Progress | None = None) -> Money:
    """Where the money stands at a check, in the planner's terms (budget/money.py)."""
    reserve = (
        max(limits.reserve_min, (progress.final_checkpoint_s if progress else 0.0) / 60)
        + (progress.final_eval_s if progress else 0.0) / 60
    )
    fixed_in = memory.last_good is not None and memory.last_good.fixed_usd is not None
    return Money(
        limits.cap_usd,
        memory.rate_usd_per_hr or 0.0,
        lines=limits.lines,
        spent_usd=spent,
        fixed_in_spent=fixed_in,
        reserve_min=reserve,
    )


def _decision(
    notes: _Notes,
    action: Action,
    reason: str,
    spent: float | None,
    projected: float | None,
    own: float | None,
    file_proj: float | None,
) -> tuple[Decision, Memory]:
    cause = {
        Action.EXIT_NOW: "cap",
        Action.CHECKPOINT_AND_EXIT: "unknown" if reason.startswith("spend unknown") else "projection",
    }.get(action, "")
    return Decision(
        action,
        reason,
        spent,
        projected,
        own,
        file_proj,
        tuple(notes.alerts),
        tuple(notes.warnings),
        notes.memory.rate_usd_per_hr,
        cause,
    ), notes.memory
