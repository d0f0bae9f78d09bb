"""The cost ledger: ``<ckpt-dir>/budget_ledger.json``, the budget guard's memory across processes.

It holds when the run first started (``--budget-max-hours`` counts wall time from there, downtime included) and
what the guard has seen and decided: the spend it used (never decreasing) and when, the rate that
ages it, the launch rate, the newest valid reading, which alerts were sent, since when the spend has been
unknown, and a bounded list of events (checks that warned, alerted or stopped; each process start). It is
written atomically after every check by the trainer's rank 0 (the only writer) and read by the watchdog.

A missing ledger starts from the budget snapshot of the newest checkpoint (older runs), else from nothing;
an unreadable one, or one whose money fields are not finite numbers of 0 or more (``problem_of``: a ledger may
come from a bucket, and a negative ``earlier_machines_usd`` would lower every reading), is set aside as
``budget_ledger.json.bad-<time>`` and named in a warning, never silently replaced.
"""

from __future__ import annotations

import json
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.fileio import write_text_atomic
from .guard import Decision, Memory, Snapshot, format_time, parse, parse_time

LEDGER_FILE = "budget_ledger.json"
FORMAT = "x1-budget-ledger/1"
MAX_EVENTS = 500


def memory_to_json(m: Memory) -> dict[str, Any]:
    return {
        "spent_usd": m.spent_usd,
        "spent_at_utc": format_time(m.spent_at) if m.spent_at else None,
        "rate_usd_per_hr": m.rate_usd_per_hr,
        "launch_rate_usd_per_hr": m.launch_rate_usd_per_hr,
        "last_reading": m.last_good.to_json() if m.last_good else None,
        "alerts_sent": sorted(m.alerted),
        "unknown_since_utc": format_time(m.unknown_since) if m.unknown_since else None,
        "machine": m.machine,
        "earlier_machines_usd": m.earlier_usd,
        "machines": [{"machine": k, "compute_usd": v} for k, v in m.machines],
    }


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def memory_from_json(d: dict[str, Any]) -> Memory:
    last: Snapshot | None = None
    if isinstance(d.get("last_reading"), dict):
        last = parse(d["last_reading"]).snapshot
    alerted = d.get("alerts_sent") or []
    return Memory(
        last_good=last,
        alerted=frozenset(str(a) for a in alerted if isinstance(a, str)),
        unknown_since=parse_time(d.get("unknown_since_utc")),
        spent_usd=_num(d.get("spent_usd")),
        spent_at=parse_time(d.get("spent_at_utc")),
        rate_usd_per_hr=_num(d.get("rate_usd_per_hr")),
        launch_rate_usd_per_hr=_num(d.get("launch_rate_usd_per_hr")),
        machine=d["machine"] if isinstance(d.get("machine"), str) else None,
        earlier_usd=_num(d.get("earlier_machines_usd")) or 0.0,
        machines=tuple(
            (str(e["machine"]), _num(e.get("compute_usd")) or 0.0)
            for e in d.get("machines") or []
            if isinstance(e, dict) and "machine" in e
        ),
    )


_MONEY_KEYS = ("spent_usd", "rate_usd_per_hr", "launch_rate_usd_per_hr", "earlier_machines_usd")


def _bad_number(v: Any) -> bool:
    """Not absent and not a finite, non-negative number: a ledger with it could lower the spend the cap guards."""
    if v is None:
        return False
    return isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0


def problem_of(data: Any, where: str) -> str | None:
    """Why ``data`` (decoded JSON) is not an x1 ledger to trust, or None: a dict with the format field, whose money
    fields (the memory's spend, rates, earlier machines' bill, each machine's bill, the cap) are finite and
    non-negative. A ledger pulled from a bucket passes here before it is used."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"{where} is not an x1 budget ledger (a JSON object with format {FORMAT})"
    memory = data.get("memory")
    if memory is None:
        memory = {}
    if not isinstance(memory, dict):
        return f"{where}: memory is {type(memory).__name__}, not an object"
    numbers = {f"memory.{k}": memory.get(k) for k in _MONEY_KEYS} | {"cap_usd": data.get("cap_usd")}
    machines = memory.get("machines") or []
    if not isinstance(machines, list):
        return f"{where}: memory.machines is not a list"
    numbers |= {
        f"memory.machines[{i}].compute_usd": e.get("compute_usd") if isinstance(e, dict) else "?"
        for i, e in enumerate(machines)
    }
    bad = [f"{k} = {v!r}" for k, v in numbers.items() if _bad_number(v)]
    if bad:
        return f"{where}: {', '.join(bad)} (money must be a finite number, 0 or more)"
    return None


def parse_text(text: str | bytes, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the ledger, None) or (None, the problem) for a ledger's bytes, from this disk or a bucket."""
    try:
        data = json.loads(text)
    except ValueError as e:
        return None, f"{where} cannot be read ({type(e).__name__}: {e})"
    problem = problem_of(data, where)
    return (None, problem) if problem else (data, None)


def spent(data: dict[str, Any] | None) -> float:
    """The spend a ledger (one that passed ``problem_of``) has counted; -1 for none."""
    value = _num(((data or {}).get("memory") or {}).get("spent_usd"))
    return value if value is not None else -1.0


_MAX_KEYS = ("rate_usd_per_hr", "launch_rate_usd_per_hr", "earlier_machines_usd")


def merge(base: dict[str, Any] | None, other: dict[str, Any]) -> dict[str, Any]:
    """``base`` (this side's ledger; None: there is none) with the money ``other`` (one from elsewhere: a bucket,
    another machine) counted more: the larger spend with the time it was counted, the larger rates and earlier
    machines' bill, the earlier first start of the run. The rest stays ``base``'s: the alerts already sent, the
    newest reading, the machine, the events, so a ledger from elsewhere can raise the spend but never lower it
    nor mark an alert as sent. Without a ``base``, ``other`` whole but with no alert marked as sent (an alert may
    go out again on a new machine, never be suppressed). Both must have passed ``problem_of``."""
    if base is None:
        memory = dict(other.get("memory") or {})
        memory["alerts_sent"] = []
        return {**other, "memory": memory}
    mine, theirs = dict(base.get("memory") or {}), other.get("memory") or {}
    if spent(other) > spent(base):
        mine["spent_usd"], mine["spent_at_utc"] = theirs.get("spent_usd"), theirs.get("spent_at_utc")
    for key in _MAX_KEYS:
        values = [v for v in (_num(mine.get(key)), _num(theirs.get(key))) if v is not None]
        if values:
            mine[key] = max(values)
    out = {**base, "memory": mine}
    here, there = parse_time(base.get("run_started_utc")), parse_time(other.get("run_started_utc"))
    if there is not None and (here is None or there < here):
        out["run_started_utc"] = format_time(there)
    return out


def read(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the ledger's JSON, None), (None, None) when there is none, or (None, the problem)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as e:
        return None, f"{path} cannot be read ({type(e).__name__}: {e})"
    return parse_text(text, str(path))


def read_memory(ckpt_dir: Path) -> Memory:
    """The guard's memory in ``ckpt_dir``'s ledger, read only (empty when there is none or it is unreadable): for
    the readers beside the trainer (the watchdog's line, the launch gate), which never write the ledger."""
    data, _ = read(ckpt_dir / LEDGER_FILE)
    return memory_from_json(data.get("memory") or {}) if data else Memory()


class Ledger:
    """The ledger file of one checkpoint dir."""

    def __init__(self, ckpt_dir: Path, cap_usd: float, log: Any = print) -> None:
        self.path = ckpt_dir / LEDGER_FILE
        self.cap_usd = cap_usd
        self._log = log
        self.events: list[dict[str, Any]] = []
        self.created_utc: str | None = None
        self.run_started_utc: str | None = None  # the run's first start (--budget-max-hours counts from it)
        self.on_saved: Any = None  # called after each write (the checkpoint mirror uploads it)
        self.unsaved = 0  # writes failed since the last one that succeeded (a full disk)

    def load(self, fallback: dict[str, Any] | None = None) -> Memory:
        """The memory in the ledger, else in ``fallback`` (a checkpoint's budget snapshot), else empty."""
        data, problem = read(self.path)
        if problem:
            bad = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
            try:
                os.replace(self.path, bad)
            except OSError:
                bad = self.path
            self._log(f"budget warning: {problem}; kept as {bad.name}, starting from the checkpoint's snapshot")
        if data is not None:
            self.events = [e for e in data.get("events", []) if isinstance(e, dict)][-MAX_EVENTS:]
            self.created_utc = data.get("created_utc")
            started = parse_time(data.get("run_started_utc"))
            self.run_started_utc = format_time(started) if started else None
            return memory_from_json(data.get("memory") or {})
        if fallback and isinstance(fallback.get("memory"), dict):
            self._log("budget: no ledger yet; starting from the budget snapshot in the checkpoint")
            return memory_from_json(fallback["memory"])
        if fallback and isinstance(fallback.get("last_good"), dict):  # checkpoints of x1 before the ledger
            return Memory(last_good=parse(fallback["last_good"]).snapshot, spent_usd=_num(fallback.get("spent_usd")))
        return Memory()

    def run_started(self, estimate_unix: float) -> float:
        """When the run first started (unix seconds): the ledger's record, else ``estimate_unix`` (this process's
        start less the wall clock of the checkpoint's earlier processes), recorded from now on."""
        started = parse_time(self.run_started_utc)
        if started is None:
            started = datetime.fromtimestamp(estimate_unix, tz=timezone.utc)
            self.run_started_utc = format_time(started)
        return started.timestamp()

    def event(self, now: datetime, kind: str, **detail: Any) -> None:
        self.events = [*self.events, {"time_utc": format_time(now), "kind": kind, **detail}][-MAX_EVENTS:]

    def record(self, now: datetime, decision: Decision, memory: Memory, step: int) -> None:
        """Save after a check; a check that warned, alerted or stopped is also an event."""
        if decision.warnings or decision.alerts or decision.action.value not in ("continue",):
            self.event(
                now,
                decision.action.value,
                step=step,
                spent_usd=decision.spent_usd,
                projected_usd=decision.projected_usd,
                reason=decision.reason,
                warnings=list(decision.warnings),
            )
        self.save(now, memory)

    def save(self, now: datetime, memory: Memory) -> None:
        self.created_utc = self.created_utc or format_time(now)
        blob = {
            "format": FORMAT,
            "cap_usd": self.cap_usd,
            "created_utc": self.created_utc,
            "run_started_utc": self.run_started_utc,
            "updated_utc": format_time(now),
            "memory": memory_to_json(memory),
            "events": self.events,
        }
        try:
            write_text_atomic(self.path, json.dumps(blob, indent=1) + "\n")
        except OSError as e:  # a full disk must not stop the guard: it still has the memory in this process
            if not self.unsaved:  # one warning an episode; the guard goes on from its memory in this process
                self._log(
                    f"budget warning: cannot write {self.path} ({e.strerror or e}); the guard goes on from "
                    "its memory in this process and writes the ledger again when it can"
                )
            self.unsaved += 1
            return
        if self.unsaved:
            self._log(f"budget: {self.path} written again ({self.unsaved} write(s) skipped)")
            self.unsaved = 0
        if self.on_saved is not None:
            self.on_saved()
