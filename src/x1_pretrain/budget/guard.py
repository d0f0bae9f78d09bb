"""The budget guard: a pure decision from (budget snapshot, limits, now, progress, memory) to an action.

Rules (exit-now wins over checkpoint-and-exit, which wins over alert):

* spent (or spend extrapolated from the last good reading) above the cap → EXIT_NOW (exit 4, no checkpoint:
  the money is already gone, a checkpoint would only spend more),
* projected total above the cap → CHECKPOINT_AND_EXIT (exit 3). The projection is the larger of the
  sidecar's ``projected_total_usd`` and the guard's own: spent + rate x (remaining steps / measured steps
  per hour + the time a final checkpoint takes),
* spent above the alert line → ALERT (email + Slack), once per crossing; training carries on,
* faults never pass silently and never crash the run: a missing, unreadable, invalid or future-dated
  file, missing or negative/NaN/infinite fields → the last good reading is extrapolated at its rate and an
  alert is sent once; a reading older than ``stale_after_intervals`` sidecar intervals is stale → the same.
  When no reading younger than ``unknown_grace_min`` exists, the spend is unknown → CHECKPOINT_AND_EXIT:
  unknown spend is not safe spend.
"""

from __future__ import annotations

import json
import math
import urllib.request
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path
from typing import Any

FIELDS = ("spent_usd", "rate_usd_per_hr", "hours_elapsed", "projected_total_usd", "last_update_utc")
FUTURE_TOLERANCE = timedelta(minutes=2)


class Action(str, Enum):
    CONTINUE = "continue"
    ALERT = "alert"
    CHECKPOINT_AND_EXIT = "checkpoint-and-exit"
    EXIT_NOW = "exit-now"


@dataclass(frozen=True)
class Snapshot:
    spent_usd: float
    rate_usd_per_hr: float
    hours_elapsed: float
    projected_total_usd: float
    last_update_utc: datetime

    def to_json(self) -> dict[str, Any]:
        return {"spent_usd": self.spent_usd, "rate_usd_per_hr": self.rate_usd_per_hr,
                "hours_elapsed": self.hours_elapsed, "projected_total_usd": self.projected_total_usd,
                "last_update_utc": self.last_update_utc.strftime("%Y-%m-%dT%H:%M:%SZ")}


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
    stale_after_intervals: float = 3.0
    unknown_grace_min: float = 60.0


@dataclass(frozen=True)
class Progress:
    steps_done: int
    total_steps: int
    steps_per_hour: float | None        # measured in this process; None before enough steps
    final_checkpoint_s: float = 0.0     # how long the last checkpoint took (the final one will too)


@dataclass(frozen=True)
class Memory:
    """What the guard carries from one check to the next (passed in and returned: decide stays pure)."""

    last_good: Snapshot | None = None
    alerted: frozenset[str] = field(default_factory=frozenset)
    unknown_since: datetime | None = None   # first check that found no usable reading at all


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    spent_usd: float | None
    projected_usd: float | None
    own_projection_usd: float | None
    file_projection_usd: float | None
    alerts: tuple[str, ...] = ()        # messages to send now (each fires once per crossing)
    warnings: tuple[str, ...] = ()      # faults to log now


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
    return Reading(Snapshot(nums["spent_usd"], nums["rate_usd_per_hr"], nums["hours_elapsed"],
                            nums["projected_total_usd"], t))


def read_source(uri: str, timeout_s: float = 10.0) -> Reading:
    """Read budget.json from a path, a file:// URI or an http(s):// URL. Never raises."""
    try:
        if uri.startswith(("http://", "https://")):
            with urllib.request.urlopen(uri, timeout=timeout_s) as r:
                text = r.read().decode()
        else:
            path = Path(uri[len("file://"):]) if uri.startswith("file://") else Path(uri)
            text = path.read_text()
    except FileNotFoundError:
        return Reading(None, f"{uri} does not exist (is the budget sidecar running?)")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return Reading(None, f"{uri} cannot be read ({type(e).__name__}: {e})")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return Reading(None, f"{uri} is not valid JSON ({e.msg} at line {e.lineno})")
    return parse(data)


def _once(memory: Memory, key: str, message: str, alerts: list[str]) -> Memory:
    if key in memory.alerted:
        return memory
    alerts.append(message)
    return replace(memory, alerted=memory.alerted | {key})


def _rearm(memory: Memory, *keys: str) -> Memory:
    return replace(memory, alerted=memory.alerted - set(keys))


def decide(reading: Reading, limits: Limits, now: datetime, progress: Progress,
           memory: Memory) -> tuple[Decision, Memory]:
    alerts: list[str] = []
    warnings: list[str] = []
    snap = reading.snapshot
    if snap is not None and snap.last_update_utc - now > FUTURE_TOLERANCE:
        warnings.append(f"budget.json last_update_utc {snap.last_update_utc:%Y-%m-%dT%H:%M:%SZ} is in the future "
                        f"(now {now:%Y-%m-%dT%H:%M:%SZ}); ignoring it (clock skew or a broken sidecar)")
        memory = _once(memory, "future", warnings[-1], alerts)
        snap = None
    elif snap is not None:
        memory = _rearm(memory, "future")
    if reading.problem:
        warnings.append(reading.problem)
        memory = _once(memory, "unreadable", f"budget source problem: {reading.problem}", alerts)
    elif snap is not None:
        memory = _rearm(memory, "unreadable")
    if snap is not None:
        memory = replace(memory, last_good=snap, unknown_since=None)
    basis = memory.last_good

    if basis is None:
        since = memory.unknown_since or now
        memory = replace(memory, unknown_since=since)
        waited_min = (now - since).total_seconds() / 60
        if waited_min <= limits.unknown_grace_min:
            msg = (f"spend unknown for {waited_min:.0f} min (no valid budget reading yet); stopping with a "
                   f"checkpoint after {limits.unknown_grace_min:g} min without one")
            warnings.append(msg)
            memory = _once(memory, "unknown", msg, alerts)
            return Decision(Action.ALERT if alerts else Action.CONTINUE, msg, None, None, None, None,
                            tuple(alerts), tuple(warnings)), memory
        return _unknown(memory, alerts, warnings, f"no valid budget reading in {waited_min:.0f} min "
                        f"(grace {limits.unknown_grace_min:g} min)")
    age_h = max((now - basis.last_update_utc).total_seconds() / 3600, 0.0)
    if age_h * 60 > limits.unknown_grace_min:
        return _unknown(memory, alerts, warnings,
                        f"the newest valid budget reading is {age_h * 60:.0f} min old "
                        f"(grace {limits.unknown_grace_min:g} min)")
    spent = basis.spent_usd
    if age_h * 60 > limits.stale_after_intervals * limits.sidecar_interval_min:
        spent = basis.spent_usd + basis.rate_usd_per_hr * age_h
        warnings.append(f"budget reading is {age_h * 60:.0f} min old (stale after "
                        f"{limits.stale_after_intervals * limits.sidecar_interval_min:g} min); extrapolating spend "
                        f"at ${basis.rate_usd_per_hr:.2f}/h to ${spent:.2f}")
        memory = _once(memory, "stale", warnings[-1], alerts)
    elif snap is not None:
        memory = _rearm(memory, "stale")
    elif reading.problem:
        spent = basis.spent_usd + basis.rate_usd_per_hr * age_h  # file unreadable: extrapolate the last good one

    own = None
    if progress.steps_per_hour and progress.steps_per_hour > 0:
        remaining_h = max(progress.total_steps - progress.steps_done, 0) / progress.steps_per_hour
        own = spent + basis.rate_usd_per_hr * (remaining_h + progress.final_checkpoint_s / 3600)
    file_proj = basis.projected_total_usd + (spent - basis.spent_usd)
    projected = max(own if own is not None else -math.inf, file_proj)

    if spent > limits.cap_usd:
        return Decision(Action.EXIT_NOW, f"spent ${spent:.2f} is above the cap ${limits.cap_usd:.2f}: exiting now, "
                        "without a checkpoint", spent, projected, own, file_proj, tuple(alerts),
                        tuple(warnings)), memory
    if projected > limits.cap_usd:
        return Decision(Action.CHECKPOINT_AND_EXIT, f"projected total ${projected:.2f} is above the cap "
                        f"${limits.cap_usd:.2f} (spent ${spent:.2f}): checkpoint and exit", spent, projected, own,
                        file_proj, tuple(alerts), tuple(warnings)), memory
    if spent > limits.alert_usd:
        memory = _once(memory, "alert_line", f"spent ${spent:.2f} is above the alert line ${limits.alert_usd:.2f} "
                       f"(cap ${limits.cap_usd:.2f}, projected ${projected:.2f}); training continues", alerts)
    else:
        memory = _rearm(memory, "alert_line")
    action = Action.ALERT if alerts else Action.CONTINUE
    reason = alerts[-1] if alerts else f"spent ${spent:.2f}, projected ${projected:.2f} of ${limits.cap_usd:.2f}"
    return Decision(action, reason, spent, projected, own, file_proj, tuple(alerts), tuple(warnings)), memory


def _unknown(memory: Memory, alerts: list[str], warnings: list[str], why: str) -> tuple[Decision, Memory]:
    """No usable reading for longer than the grace period: stop with a checkpoint."""
    memory = _once(memory, "unknown", f"spend unknown: {why}", alerts)
    return Decision(Action.CHECKPOINT_AND_EXIT, f"spend unknown: {why}; unknown spend is not safe spend",
                    None, None, None, None, tuple(alerts), tuple(warnings)), memory

