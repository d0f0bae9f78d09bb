"""Billing readings → budget.json, integrated: every poll adds ``rate × Δt`` to a running total kept in
``OUT.state``, so a price change never rewrites past hours, a pod restart never resets the spend, and a
restarted sidecar goes on from where it stopped (the gap is charged at the higher of the two rates). The
command, its flags and the file's contract are documented in ``budget_sidecar.py``."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ..core.contract import EXIT_OK
from ..core.errors import X1Error
from ..core.fileio import write_text_atomic
from .providers import ApiSource, BillingReading, ClockSource, NodesSource, PollError, SelectionError

_log = logging.getLogger(__name__)

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
CROSS_CHECK_USD = 0.50  # the balance and the integrated total may differ this much (or 10 %) silently


def format_utc(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime(TIME_FORMAT)


def parse_utc(text: str) -> datetime:
    """ISO 8601 → aware UTC datetime; a time without an offset is taken as UTC."""
    t = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def boot_time() -> datetime | None:
    """When this machine booted (``btime`` in /proc/stat; in a container, the host VM's), or None."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return datetime.fromtimestamp(int(line.split()[1]), timezone.utc)
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True, kw_only=True)
class FixedLines:
    """The bill's lines besides compute (the lab: $1 egress, $2 disk), counted in full from the start."""

    disk_usd: float = 2.0
    egress_usd: float = 1.0

    @property
    def total(self) -> float:
        return self.disk_usd + self.egress_usd


@dataclass
class State:
    """``OUT.state``: what the sidecar has counted so far (written atomically after every good poll)."""

    started_utc: datetime | None = None
    started_from: str = ""
    compute_usd: float = 0.0
    last_poll_utc: datetime | None = None
    last_rate_usd_per_hr: float = 0.0
    last_uptime_s: float | None = None
    balance_start_usd: float | None = None  # the account balance at the first poll that reported one
    compute_at_balance_start: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "started_utc": format_utc(self.started_utc) if self.started_utc else None,
            "started_from": self.started_from,
            "compute_usd": self.compute_usd,
            "last_poll_utc": format_utc(self.last_poll_utc) if self.last_poll_utc else None,
            "last_rate_usd_per_hr": self.last_rate_usd_per_hr,
            "last_uptime_s": self.last_uptime_s,
            "balance_start_usd": self.balance_start_usd,
            "compute_at_balance_start": self.compute_at_balance_start,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> State:
        def t(key: str) -> datetime | None:
            return parse_utc(d[key]) if d.get(key) else None

        return cls(
            t("started_utc"),
            str(d.get("started_from") or ""),
            float(d.get("compute_usd") or 0.0),
            t("last_poll_utc"),
            float(d.get("last_rate_usd_per_hr") or 0.0),
            d.get("last_uptime_s"),
            d.get("balance_start_usd"),
            float(d.get("compute_at_balance_start") or 0.0),
        )


def state_path(out: Path) -> Path:
    return Path(f"{out}.state")


def load_state(out: Path) -> State:
    """The sidecar's counted spend; an ``OUT.start`` from an older sidecar gives the start only."""
    path, legacy = state_path(out), Path(f"{out}.start")
    try:
        if path.exists():
            return State.from_json(json.loads(path.read_text()))
        if legacy.exists():
            return State(parse_utc(json.loads(legacy.read_text())["started_utc"]), str(legacy))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        bad = path if path.exists() else legacy
        raise X1Error(
            f"{bad} is unreadable; it holds the spend counted so far: repair it, or delete it to count "
            "again from --started-utc (or the machine's boot time)"
        ) from None
    return State()


def resolve_start(state: State, flag: str | None, reading: BillingReading, now: datetime) -> None:
    """When billing started, and what said so: --started-utc, else the provider's uptime, else (a VM) this
    machine's boot time, else now. Decided once, at the first good poll, and kept in the state."""
    if state.started_utc is not None and flag is None:
        return
    if flag is not None and flag != "now":
        try:
            state.started_utc, state.started_from = parse_utc(flag), "--started-utc"
        except ValueError:
            raise X1Error(f"--started-utc {flag!r} is not an ISO time; use e.g. 2026-05-23T03:00:00Z") from None
    elif flag == "now":
        state.started_utc, state.started_from = now, "--started-utc now (the sidecar's first poll)"
    elif reading.uptime_s is not None:
        state.started_utc, state.started_from = now - timedelta(seconds=reading.uptime_s), "the provider's uptime"
    elif (boot := boot_time()) is not None and boot <= now:
        state.started_utc, state.started_from = boot, "this machine's boot time (/proc/stat btime)"
    else:
        state.started_utc, state.started_from = now, "the sidecar's first poll (no boot time known)"


def integrate(state: State, reading: BillingReading, now: datetime) -> list[str]:
    """Add this poll's interval to the running total; returns notes worth a log line."""
    notes: list[str] = []
    rate = reading.rate_usd_per_hr
    assert state.started_utc is not None
    if state.last_poll_utc is None:  # first poll: the time since billing started, at today's rate
        state.compute_usd = rate * max((now - state.started_utc).total_seconds(), 0.0) / 3600
    else:
        dt_h = max((now - state.last_poll_utc).total_seconds(), 0.0) / 3600
        state.compute_usd += max(rate, state.last_rate_usd_per_hr) * dt_h
        if rate != state.last_rate_usd_per_hr:
            notes.append(
                f"rate changed ${state.last_rate_usd_per_hr:.2f}/h -> ${rate:.2f}/h: the past keeps its "
                "price, the interval since the last poll is counted at the higher one"
            )
    if reading.uptime_s is not None and state.last_uptime_s is not None and reading.uptime_s < state.last_uptime_s:
        notes.append(
            f"the pod restarted (uptime {reading.uptime_s:.0f} s < {state.last_uptime_s:.0f} s): spend keeps "
            "counting from the total, not from the new uptime"
        )
    state.last_poll_utc, state.last_rate_usd_per_hr, state.last_uptime_s = now, rate, reading.uptime_s
    return notes


def cross_check(state: State, reading: BillingReading) -> tuple[float | None, list[str]]:
    """Spend according to the account balance (RunPod), and notes when it and the total disagree."""
    if reading.balance_usd is None:
        return None, []
    if state.balance_start_usd is None or reading.balance_usd > state.balance_start_usd + 0.01:
        topped_up = state.balance_start_usd is not None
        state.balance_start_usd, state.compute_at_balance_start = reading.balance_usd, state.compute_usd
        return None, ["the account balance went up (a top-up?): measuring from the new balance"] if topped_up else []
    by_balance = state.compute_at_balance_start + state.balance_start_usd - reading.balance_usd
    gap = by_balance - state.compute_usd
    if abs(gap) > max(CROSS_CHECK_USD, 0.10 * state.compute_usd):
        return by_balance, [
            f"cross-check: the balance says ${by_balance:.2f} of compute, the integrated rate "
            f"${state.compute_usd:.2f}; using the higher"
        ]
    return by_balance, []


def build_budget(
    state: State, reading: BillingReading, balance_spent: float | None, now: datetime, ask: BudgetAsk
) -> dict[str, Any]:
    """The budget.json contents after a good poll."""
    assert state.started_utc is not None
    hours = max((now - state.started_utc).total_seconds(), 0.0) / 3600
    compute = max(state.compute_usd, balance_spent or 0.0)
    spent = compute + ask.fixed.total
    rate = reading.rate_usd_per_hr
    return {
        "spent_usd": round(spent, 4),
        "rate_usd_per_hr": round(rate, 6),
        "hours_elapsed": round(hours, 4),
        "projected_total_usd": round(spent + rate * max(0.0, ask.planned_hours - hours), 4),
        "last_update_utc": format_utc(now),
        "compute_usd": round(compute, 4),
        "fixed_usd": {"disk_usd": ask.fixed.disk_usd, "egress_usd": ask.fixed.egress_usd},
        "balance_spent_usd": None if balance_spent is None else round(balance_spent, 4),
        "provider": ask.provider,
        "resource_id": reading.resource_id,
        "started_utc": format_utc(state.started_utc),
        "started_from": state.started_from,
        "planned_hours": ask.planned_hours,
    }


@dataclass(frozen=True)
class BudgetAsk:
    """What the user set about the bill: the provider, the run's planned length, the fixed lines, the start."""

    provider: str
    planned_hours: float = 24.0
    fixed: FixedLines = FixedLines()
    started_flag: str | None = None


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


@dataclass
class Sidecar:
    """Polls a source; after every good poll adds to the total and rewrites budget.json; after a bad one leaves
    both alone (the guard sees the reading's age and ages it)."""

    source: ApiSource | ClockSource | NodesSource
    out: Path
    ask: BudgetAsk
    state: State = field(default_factory=State)
    now: Callable[[], datetime] = utc_now
    polled_ok: bool = False

    def _say(self, line: str) -> None:
        _log.info(line)

    def poll(self) -> bool:
        """One poll. True when budget.json was rewritten. SelectionError escapes only before the first success."""
        name = self.source.provider
        try:
            reading = self.source.read()
            now = self.now()
            first = self.state.started_utc is None
            resolve_start(self.state, self.ask.started_flag if first else None, reading, now)
            if first:
                self._say(f"counting from {self.state.to_json()['started_utc']} ({self.state.started_from})")
            notes = integrate(self.state, reading, now)
            balance_spent, more = cross_check(self.state, reading)
            budget = build_budget(self.state, reading, balance_spent, now, self.ask)
            write_json_atomic(state_path(self.out), self.state.to_json())
            write_json_atomic(self.out, budget)
        except PollError as e:
            _log.warning(f"{name}: {e.kind}{': ' + e.detail if e.detail else ''}; budget.json left as it was")
            return False
        except SelectionError as e:
            if not self.polled_ok:
                raise
            _log.warning(f"{name}: {e}; budget.json left as it was")
            return False
        except OSError as e:
            _log.warning(f"{name}: cannot write {self.out}: {e.strerror or e}; will retry")
            return False
        self.polled_ok = True
        for note in notes + more:
            _log.warning(f"{name}: {note}")  # a restart, a balance that disagrees: worth a look
        what = name if reading.resource_id == name else f"{name} {reading.resource_id}"
        self._say(
            f"{what}: spent ${budget['spent_usd']:.2f} (compute ${budget['compute_usd']:.2f} + fixed "
            f"${self.ask.fixed.total:.2f}) at ${budget['rate_usd_per_hr']:.2f}/h over "
            f"{budget['hours_elapsed']:.2f} h, projected ${budget['projected_total_usd']:.2f}"
        )
        return True

    def run(self, interval_s: float, stop: threading.Event) -> int:
        """Poll, then wait ``interval_s``, until ``stop`` is set (by SIGTERM/SIGINT in main)."""
        while not stop.is_set():
            self.poll()
            stop.wait(interval_s)
        self._say("stopped")
        return EXIT_OK
