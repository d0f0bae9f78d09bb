"""The budget sidecar against a local server that answers like Lambda's and RunPod's APIs (and fails
like them), the clock provider, the recorded start, the CLI's exit codes and the real polling loop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from x1_pretrain import budget_sidecar as bs_cli
from x1_pretrain.budget import providers as pv
from x1_pretrain.budget import sidecar as bs
from x1_pretrain.budget.providers import lambda_cloud, runpod
from x1_pretrain.core.errors import X1Error

from ..conftest import REPO

KEY = "sk-test-SECRETKEY-4f9a7c"
T0 = datetime(2026, 5, 23, 3, 0, 0, tzinfo=timezone.utc)


def lambda_body(*instances: tuple[str, str, int]) -> dict:
    return {
        "data": [
            {
                "id": i,
                "status": s,
                "name": "x1",
                "instance_type": {"name": "gpu_1x_a100_sxm4", "price_cents_per_hour": c},
            }
            for i, s, c in instances
        ]
    }


def runpod_body(*pods: tuple[str, str, float, float | None]) -> dict:
    return {
        "data": {
            "myself": {
                "pods": [
                    {
                        "id": i,
                        "name": "x1",
                        "costPerHr": c,
                        "desiredStatus": s,
                        "runtime": None if up is None else {"uptimeInSeconds": up},
                    }
                    for i, s, c, up in pods
                ]
            }
        }
    }


LAMBDA_OK = lambda_body(("inst-a", "active", 110), ("inst-old", "terminated", 200))
RUNPOD_OK = runpod_body(("pod-a", "RUNNING", 0.79, 7200), ("pod-old", "EXITED", 2.0, None))


# --- a fake cloud -------------------------------------------------------------------------------------
class Cloud:
    """Replies per path: (status, body, delay_s). Records (method, path, authorization, body)."""

    def __init__(self) -> None:
        self.replies: dict[str, tuple[int, bytes, float]] = {}
        self.requests: list[tuple[str, str, str | None, bytes]] = []
        self.release = threading.Event()

    def reply(self, path: str, body: object, status: int = 200, delay: float = 0.0) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.replies[path] = (status, raw, delay)


@pytest.fixture
def cloud() -> Iterator[tuple[Cloud, str]]:
    state = Cloud()
    state.reply("/api/v1/instances", LAMBDA_OK)
    state.reply("/graphql", RUNPOD_OK)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            state.requests.append((self.command, self.path, self.headers.get("Authorization"), self.rfile.read(length)))
            status, raw, delay = state.replies.get(self.path, (404, b'{"error": "not found"}', 0.0))
            if delay:
                state.release.wait(delay)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.handle_error = lambda request, client_address: None  # a client that timed out is expected
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


class Clock:
    def __init__(self, t: datetime) -> None:
        self.t = t

    def __call__(self) -> datetime:
        return self.t


NO_LINES = bs.FixedLines(disk_usd=0.0, egress_usd=0.0)


def ask(
    provider: str, started: datetime | None = T0, planned: float = 24.0, fixed: bs.FixedLines = NO_LINES
) -> bs.BudgetAsk:
    return bs.BudgetAsk(provider, planned, fixed, None if started is None else started.isoformat())


def api_sidecar(
    provider: str,
    base: str,
    out: Path,
    clock: Clock,
    timeout_s: float = 0.5,
    resource_id: str | None = None,
    started: datetime | None = T0,
) -> bs.Sidecar:
    source = pv.ApiSource(provider, base, KEY, pv.APIS[provider].key_env, timeout_s, resource_id)
    return bs.Sidecar(source, out, ask(provider, started), bs.load_state(out), now=clock)


def no_temp_files(d: Path) -> bool:
    return all(".tmp" not in p.name for p in d.iterdir())


# --- pure functions -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "wanted", "rate", "rid"),
    [
        (LAMBDA_OK, None, 1.10, "inst-a"),
        (lambda_body(("a", "active", 110), ("b", "booting", 129)), "b", 1.29, "b"),
        (lambda_body(("a", "terminated", 110)), "a", 1.10, "a"),
        (lambda_body(("a", "unhealthy", 75)), None, 0.75, "a"),
    ],
)
def test_parse_lambda(body, wanted, rate, rid):
    r = lambda_cloud.parse_lambda(body, wanted)
    assert (r.rate_usd_per_hr, r.uptime_s, r.resource_id) == (pytest.approx(rate), None, rid)


@pytest.mark.parametrize(
    ("body", "wanted", "error", "needle"),
    [
        (lambda_body(("a", "active", 110), ("b", "active", 110)), None, pv.SelectionError, "--instance-id"),
        (lambda_body(("a", "terminated", 110)), None, pv.SelectionError, "no running instance"),
        (LAMBDA_OK, "nope", pv.SelectionError, "inst-a, inst-old"),
        (
            {"data": [{"id": "a", "status": "active", "instance_type": {"name": "x"}}]},
            None,
            pv.PollError,
            "data[0].instance_type.price_cents_per_hour",
        ),
        ({"data": [{"id": "a", "status": "active"}]}, None, pv.PollError, "data[0].instance_type"),
        (
            {"data": [{"id": "a", "status": "active", "instance_type": {"price_cents_per_hour": "110"}}]},
            None,
            pv.PollError,
            "not a non-negative number",
        ),
        ({"data": {"id": "a"}}, None, pv.PollError, "not a list"),
        ({"error": {"code": "global/invalid-api-key"}}, None, pv.PollError, "body.data"),
        ([1, 2], None, pv.PollError, "body.data"),
    ],
)
def test_parse_lambda_errors(body, wanted, error, needle):
    with pytest.raises(error) as e:
        lambda_cloud.parse_lambda(body, wanted)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    ("body", "wanted", "rate", "uptime", "rid"),
    [
        (RUNPOD_OK, None, 0.79, 7200.0, "pod-a"),
        (runpod_body(("p", "RUNNING", 0.79, None)), None, 0.79, None, "p"),
        (runpod_body(("p", "RUNNING", 1, 0), ("q", "RUNNING", 2, 60)), "q", 2.0, 60.0, "q"),
    ],
)
def test_parse_runpod(body, wanted, rate, uptime, rid):
    r = runpod.parse_runpod(body, wanted)
    assert (r.rate_usd_per_hr, r.uptime_s, r.resource_id) == (pytest.approx(rate), uptime, rid)


@pytest.mark.parametrize(
    ("body", "error", "needle"),
    [
        ({"errors": [{"message": "Not authorized"}], "data": None}, pv.PollError, "Not authorized"),
        (runpod_body(("p", "RUNNING", 1, 0), ("q", "RUNNING", 2, 60)), pv.SelectionError, "--pod-id"),
        ({"data": {"myself": {"pods": [{"id": "p", "desiredStatus": "RUNNING"}]}}}, pv.PollError, "pods[0].costPerHr"),
        ({"data": {"myself": None}}, pv.PollError, "body.data.myself"),
        ({"data": None}, pv.PollError, "body.data"),
        (runpod_body(("p", "RUNNING", -1.0, 5)), pv.PollError, "costPerHr"),
    ],
)
def test_parse_runpod_errors(body, error, needle):
    with pytest.raises(error) as e:
        runpod.parse_runpod(body)
    assert needle in str(e.value)
    if error is pv.PollError and "errors" in body:
        assert e.value.kind == "API error"


@pytest.mark.parametrize(
    ("now", "planned", "spent", "hours", "projected"),
    [
        (T0 + timedelta(hours=2), 24.0, 2.2, 2.0, 26.4),
        (T0 - timedelta(hours=1), 24.0, 0.0, 0.0, 26.4),  # a start in the future counts as 0
        (T0 + timedelta(hours=30), 24.0, 33.0, 30.0, 33.0),  # past the plan: projected = spent
        (T0 + timedelta(minutes=30), 10.0, 0.55, 0.5, 11.0),
    ],
)
def test_the_first_poll_counts_from_the_start(now, planned, spent, hours, projected):
    state = bs.State(T0, "--started-utc")
    reading = pv.BillingReading(1.10, None, "inst-a")
    bs.integrate(state, reading, now)
    b = bs.build_budget(state, reading, None, now, ask("lambda", planned=planned))
    assert b["spent_usd"] == pytest.approx(spent)
    assert b["hours_elapsed"] == pytest.approx(hours)
    assert b["projected_total_usd"] == pytest.approx(projected)
    assert b["rate_usd_per_hr"] == pytest.approx(1.10)
    assert b["last_update_utc"] == now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert b["started_utc"] == "2026-05-23T03:00:00Z" and b["started_from"] == "--started-utc"


@pytest.mark.parametrize(
    "text", ["2026-05-23T03:00:00Z", "2026-05-23T03:00:00", "2026-05-23T05:00:00+02:00", "2026-05-23 03:00:00+00:00"]
)
def test_parse_utc(text):
    assert bs.parse_utc(text) == T0


# --- against the fake cloud ---------------------------------------------------------------------------
def test_lambda_poll_writes_the_contract(cloud, tmp_path):
    state, base = cloud
    out = tmp_path / "budget.json"
    side = api_sidecar("lambda", base, out, Clock(T0 + timedelta(hours=12.9)))
    assert side.poll()
    b = json.loads(out.read_text())
    assert {"spent_usd", "rate_usd_per_hr", "hours_elapsed", "projected_total_usd", "last_update_utc"} <= set(b)
    assert b["spent_usd"] == pytest.approx(14.19)
    assert b["rate_usd_per_hr"] == pytest.approx(1.10)
    assert b["hours_elapsed"] == pytest.approx(12.9)
    assert b["projected_total_usd"] == pytest.approx(26.4)
    assert b["last_update_utc"] == "2026-05-23T15:54:00Z"
    assert b["resource_id"] == "inst-a" and b["provider"] == "lambda"
    ((method, path, auth, _),) = state.requests
    assert (method, path, auth) == ("GET", "/api/v1/instances", f"Bearer {KEY}")
    assert no_temp_files(tmp_path)
    assert KEY not in out.read_text()


def test_the_budget_guard_accepts_what_the_sidecar_writes(tmp_path):
    from x1_pretrain.budget import guard

    out = tmp_path / "budget.json"
    side = bs.Sidecar(
        pv.ClockSource(1.10), out, ask("clock", fixed=bs.FixedLines()), now=Clock(T0 + timedelta(hours=3))
    )
    assert side.poll()
    reading = guard.parse(json.loads(out.read_text()))
    assert reading.problem is None
    assert reading.snapshot.spent_usd == pytest.approx(3.3 + 3.0)  # compute + the lab's $2 disk and $1 egress
    assert reading.snapshot.fixed_usd == pytest.approx(3.0)
    assert reading.snapshot.last_update_utc == T0 + timedelta(hours=3)


def test_runpod_poll_uses_graphql_and_uptime(cloud, tmp_path):
    state, base = cloud
    out = tmp_path / "budget.json"
    assert api_sidecar("runpod", base, out, Clock(T0 + timedelta(hours=5)), started=None).poll()
    b = json.loads(out.read_text())
    assert b["rate_usd_per_hr"] == pytest.approx(0.79)
    assert b["hours_elapsed"] == pytest.approx(2.0)  # no --started-utc: the pod's uptime says when
    assert b["spent_usd"] == pytest.approx(1.58)
    assert b["started_from"] == "the provider's uptime"
    ((method, path, auth, body),) = state.requests
    assert (method, path, auth) == ("POST", "/graphql", f"Bearer {KEY}")
    assert json.loads(body) == {"query": runpod.RUNPOD_QUERY}


FAILURES = [
    ("lambda", "/api/v1/instances", {"error": {"code": "global/invalid-api-key"}}, 401, 0.0, "HTTP 401"),
    ("lambda", "/api/v1/instances", b"<html>Internal Server Error</html>", 500, 0.0, "HTTP 500"),
    ("lambda", "/api/v1/instances", b"{not json", 200, 0.0, "malformed JSON"),
    ("lambda", "/api/v1/instances", {"data": [{"id": "inst-a", "status": "active"}]}, 200, 0.0, "missing field"),
    ("lambda", "/api/v1/instances", LAMBDA_OK, 200, 1.5, "timeout"),
    ("runpod", "/graphql", {"errors": [{"message": f"invalid api key {KEY}"}]}, 200, 0.0, "API error"),
    ("runpod", "/graphql", {"data": {"myself": {"pods": [{"id": "pod-a"}]}}}, 200, 0.0, "missing field"),
    ("runpod", "/graphql", b"", 502, 0.0, "HTTP 502"),
    ("runpod", "/graphql", RUNPOD_OK, 200, 1.5, "timeout"),
]


@pytest.mark.parametrize(("provider", "path", "body", "status", "delay", "kind"), FAILURES)
def test_a_failed_poll_leaves_budget_json_alone(cloud, tmp_path, capsys, provider, path, body, status, delay, kind):
    state, base = cloud
    out = tmp_path / "budget.json"
    clock = Clock(T0 + timedelta(hours=1))
    side = api_sidecar(provider, base, out, clock, timeout_s=0.3)
    assert side.poll()
    before = out.read_bytes()
    capsys.readouterr()

    state.reply(path, body, status, delay)
    clock.t += timedelta(minutes=5)
    assert not side.poll()
    assert out.read_bytes() == before  # last good values, last_update_utc unchanged
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"WARNING budget.sidecar: {provider}: {kind}" in err
    assert KEY not in err and KEY not in out.read_text()
    if kind == "HTTP 401":
        assert "LAMBDA_API_KEY" in err
    assert no_temp_files(tmp_path)

    state.reply(path, LAMBDA_OK if provider == "lambda" else RUNPOD_OK)  # the API recovers
    clock.t += timedelta(minutes=5)
    assert side.poll()
    assert json.loads(out.read_text())["last_update_utc"] == "2026-05-23T04:10:00Z"


def test_network_error_when_nothing_listens(tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    side = api_sidecar("lambda", f"http://127.0.0.1:{port}", tmp_path / "budget.json", Clock(T0))
    assert not side.poll()
    assert not (tmp_path / "budget.json").exists()
    err = capsys.readouterr().err
    assert "lambda: network error" in err and KEY not in err


def test_the_followed_instance_is_pinned_after_the_first_poll(cloud, tmp_path, capsys):
    state, base = cloud
    side = api_sidecar("lambda", base, tmp_path / "budget.json", Clock(T0 + timedelta(hours=1)))
    assert side.poll()
    # A second instance appears: no longer ambiguous, the sidecar keeps following inst-a.
    state.reply("/api/v1/instances", lambda_body(("inst-b", "active", 300), ("inst-a", "active", 110)))
    assert side.poll()
    assert json.loads((tmp_path / "budget.json").read_text())["rate_usd_per_hr"] == pytest.approx(1.10)
    # inst-a vanishes: logged and skipped, not fatal, once a poll has succeeded.
    state.reply("/api/v1/instances", lambda_body(("inst-b", "active", 300)))
    assert not side.poll()
    assert "--instance-id inst-a: no such instance" in capsys.readouterr().err


def test_a_key_that_breaks_the_header_is_not_shown(cloud, tmp_path, capsys):
    _, base = cloud
    bad = "sk-broken\nkey-SECRET"
    source = pv.ApiSource("lambda", base, bad, "LAMBDA_API_KEY", 0.5)
    side = bs.Sidecar(source, tmp_path / "budget.json", ask("lambda"), now=Clock(T0))
    assert not side.poll()
    err = capsys.readouterr().err
    assert "lambda: network error" in err and bad not in err


# --- start time and the running total -------------------------------------------------------------------
def test_where_the_start_comes_from(tmp_path):
    now = T0 + timedelta(hours=1)
    no_uptime, uptime = pv.BillingReading(1.0, None, "a"), pv.BillingReading(1.0, 600.0, "p")
    s = bs.State()
    bs.resolve_start(s, "2026-05-22T21:00:00Z", uptime, now)
    assert (s.started_utc, s.started_from) == (T0 - timedelta(hours=6), "--started-utc")
    s = bs.State()
    bs.resolve_start(s, None, uptime, now)
    assert (s.started_utc, s.started_from) == (now - timedelta(seconds=600), "the provider's uptime")
    s = bs.State()
    bs.resolve_start(s, None, no_uptime, datetime.now(timezone.utc))
    assert s.started_utc == bs.boot_time() and "boot time" in s.started_from  # a VM bills from its boot
    s = bs.State()
    bs.resolve_start(s, "now", uptime, now)
    assert s.started_utc == now
    with pytest.raises(X1Error, match="--started-utc"):
        bs.resolve_start(bs.State(), "yesterday", no_uptime, now)


def test_an_unreadable_state_file_is_a_usage_error(tmp_path):
    (tmp_path / "budget.json.state").write_text("garbage")
    with pytest.raises(X1Error, match="delete it"):
        bs.load_state(tmp_path / "budget.json")


def test_a_price_change_keeps_the_past_and_a_restarted_sidecar_goes_on(tmp_path):
    out = tmp_path / "budget.json"
    clock = Clock(T0)
    source = pv.ClockSource(1.40)
    side = bs.Sidecar(source, out, ask("clock"), now=clock)
    for h in range(1, 21):  # 20 h at $1.40, polled hourly
        clock.t = T0 + timedelta(hours=h)
        assert side.poll()
    assert json.loads(out.read_text())["spent_usd"] == pytest.approx(28.0)
    # the sidecar restarts (a new process, from OUT.state) and the price has dropped to $0.79
    side = bs.Sidecar(pv.ClockSource(0.79), out, ask("clock"), bs.load_state(out), now=clock)
    clock.t += timedelta(hours=1)
    assert side.poll()
    b = json.loads(out.read_text())
    assert b["spent_usd"] == pytest.approx(28.0 + 1.40)  # the gap at the higher of the two rates
    clock.t += timedelta(hours=1)
    assert side.poll()
    assert json.loads(out.read_text())["spent_usd"] == pytest.approx(28.0 + 1.40 + 0.79)


def test_a_pod_restart_does_not_reset_the_spend(cloud, tmp_path, capsys):
    state, base = cloud
    out = tmp_path / "budget.json"
    clock = Clock(T0 + timedelta(hours=10))
    side = api_sidecar("runpod", base, out, clock, started=None)
    state.reply("/graphql", runpod_body(("pod-a", "RUNNING", 1.0, 10 * 3600)))
    assert side.poll()
    state.reply("/graphql", runpod_body(("pod-a", "RUNNING", 1.0, 60)))  # the pod restarted a minute ago
    clock.t += timedelta(hours=1)
    assert side.poll()
    assert json.loads(out.read_text())["spent_usd"] == pytest.approx(11.0)
    assert "the pod restarted" in capsys.readouterr().err


def test_runpods_balance_is_cross_checked_and_the_higher_spend_wins(cloud, tmp_path, capsys):
    state, base = cloud
    out = tmp_path / "budget.json"
    clock = Clock(T0 + timedelta(hours=1))
    side = api_sidecar("runpod", base, out, clock)

    def body(balance: float) -> dict:
        b = runpod_body(("pod-a", "RUNNING", 1.0, 3600))
        b["data"]["myself"]["clientBalance"] = balance
        return b

    state.reply("/graphql", body(100.0))
    assert side.poll()  # 1 h counted, balance 100 noted
    state.reply("/graphql", body(97.0))  # $3 gone in an hour at a "$1/h" pod
    clock.t += timedelta(hours=1)
    assert side.poll()
    b = json.loads(out.read_text())
    assert b["balance_spent_usd"] == pytest.approx(1.0 + 3.0) and b["spent_usd"] == pytest.approx(4.0)
    assert "cross-check" in capsys.readouterr().err


def test_a_server_that_drips_its_answer_is_cut_off_at_the_deadline(tmp_path, capsys):
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def drip() -> None:
        conn, _ = srv.accept()
        conn.recv(4096)
        try:
            for ch in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
                conn.send(bytes([ch]))
                time.sleep(0.1)
        except OSError:
            pass
        finally:
            conn.close()

    threading.Thread(target=drip, daemon=True).start()
    side = api_sidecar(
        "lambda", f"http://127.0.0.1:{srv.getsockname()[1]}", tmp_path / "budget.json", Clock(T0), timeout_s=1.0
    )
    t0 = time.monotonic()
    assert not side.poll()
    assert time.monotonic() - t0 < 2.5  # one byte every 0.1 s never resets a total deadline
    assert "lambda: timeout" in capsys.readouterr().err
    srv.close()


# --- CLI ----------------------------------------------------------------------------------------------
def utc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_cli_clock_once(tmp_path):
    out = tmp_path / "budget.json"
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    code = bs_cli.main(
        [
            "--provider",
            "clock",
            "--rate-usd-per-hr",
            "1.10",
            "--out",
            str(out),
            "--started-utc",
            utc(start),
            "--planned-hours",
            "10",
            "--once",
        ]
    )
    assert code == 0
    b = json.loads(out.read_text())
    assert b["hours_elapsed"] == pytest.approx(2.0, abs=0.01)
    assert b["spent_usd"] == pytest.approx(2.2 + 3.0, abs=0.02)  # + the lab's fixed lines ($2 disk, $1 egress)
    assert b["projected_total_usd"] == pytest.approx(5.2 + 1.10 * 8, abs=0.02)
    assert b["fixed_usd"] == {"disk_usd": 2.0, "egress_usd": 1.0} and b["compute_usd"] == pytest.approx(2.2, abs=0.02)
    assert b["provider"] == "clock" and b["planned_hours"] == 10
    assert abs(bs.parse_utc(b["last_update_utc"]) - datetime.now(timezone.utc)) < timedelta(seconds=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json", "budget.json.state"]


def test_cli_once_keeps_the_recorded_start_and_total(tmp_path):
    out = tmp_path / "budget.json"
    args = ["--provider", "clock", "--rate-usd-per-hr", "2", "--out", str(out), "--once", "--started-utc", "now"]
    assert bs_cli.main(args) == 0
    first = json.loads(out.read_text())
    time.sleep(0.05)
    assert bs_cli.main(args[:-2]) == 0  # a restart: no flag, the state decides
    second = json.loads(out.read_text())
    assert second["started_utc"] == first["started_utc"] and second["compute_usd"] >= first["compute_usd"]


def test_cli_lambda_once_and_its_exit_codes(cloud, tmp_path, monkeypatch, capsys):
    state, base = cloud
    monkeypatch.setenv("LAMBDA_API_KEY", KEY)
    out = tmp_path / "budget.json"
    args = ["--provider", "lambda", "--provider-base-url", base, "--out", str(out), "--once", "--timeout-s", "0.3"]
    assert bs_cli.main(args) == 0
    before = out.read_bytes()
    state.reply("/api/v1/instances", {}, 500)
    assert bs_cli.main(args) == 1
    assert out.read_bytes() == before
    captured = capsys.readouterr()
    assert KEY not in captured.err + captured.out


def test_cli_runpod_custom_key_env(cloud, tmp_path, monkeypatch):
    _, base = cloud
    monkeypatch.setenv("MY_RUNPOD_KEY", KEY)
    monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
    out = tmp_path / "budget.json"
    assert (
        bs_cli.main(
            [
                "--provider",
                "runpod",
                "--provider-base-url",
                base,
                "--api-key-env",
                "MY_RUNPOD_KEY",
                "--pod-id",
                "pod-a",
                "--out",
                str(out),
                "--once",
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["resource_id"] == "pod-a"


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--provider", "lambda"], {}, "LAMBDA_API_KEY"),
        (["--provider", "runpod"], {}, "RUNPOD_API_KEY"),
        (["--provider", "runpod", "--api-key-env", "NOPE_KEY"], {}, "NOPE_KEY"),
        (["--provider", "aws"], {}, "invalid choice"),
        (["--provider", "clock"], {}, "--rate-usd-per-hr"),
        (["--provider", "clock", "--rate-usd-per-hr", "-1"], {}, "--rate-usd-per-hr must be a positive"),
        (["--provider", "clock", "--rate-usd-per-hr", "1", "--interval-min", "0"], {}, "--interval-min"),
        (["--provider", "clock", "--rate-usd-per-hr", "1", "--disk-usd", "-2"], {}, "--disk-usd"),
        (["--provider", "lambda", "--pod-id", "p"], {"LAMBDA_API_KEY": KEY}, "--instance-id"),
        (["--provider", "lambda", "--provider-base-url", "{base}"], {"LAMBDA_API_KEY": KEY}, "--instance-id ID"),
        (
            ["--provider", "lambda", "--provider-base-url", "{base}", "--instance-id", "x"],
            {"LAMBDA_API_KEY": KEY},
            "no such",
        ),
    ],
)
def test_cli_usage_errors_exit_2(cloud, tmp_path, monkeypatch, capsys, args, env, needle):
    state, base = cloud
    state.reply("/api/v1/instances", lambda_body(("a", "active", 110), ("b", "active", 110)))
    for k in ("LAMBDA_API_KEY", "RUNPOD_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    argv = [a.replace("{base}", base) for a in args] + ["--out", str(tmp_path / "budget.json"), "--once"]
    assert bs_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and KEY not in err
    assert not (tmp_path / "budget.json").exists()


def test_cli_out_directory_must_exist(tmp_path, capsys):
    code = bs_cli.main(["--provider", "clock", "--rate-usd-per-hr", "1", "--out", str(tmp_path / "no" / "b.json")])
    assert code == 2 and "does not exist" in capsys.readouterr().err


# --- the real loop, as a process ----------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_polling_loop_in_a_process_stops_on_signal(cloud, tmp_path, sig):
    state, base = cloud
    out = tmp_path / "budget.json"
    env = {**os.environ, "LAMBDA_API_KEY": KEY, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.budget_sidecar",
        "--provider",
        "lambda",
        "--provider-base-url",
        base,
        "--out",
        str(out),
        "--interval-min",
        "0.001",
        "--timeout-s",
        "2",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 10
        while len(state.requests) < 3:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the sidecar did not poll three times"
            time.sleep(0.02)
        assert json.loads(out.read_text())["rate_usd_per_hr"] == pytest.approx(1.10)
        state.reply("/api/v1/instances", {}, 503)  # failures keep the loop going
        n = len(state.requests)
        while len(state.requests) < n + 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(sig)
        output = proc.communicate(timeout=5)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert "lambda: HTTP 503" in output and "stopped" in output
    assert KEY not in output and KEY not in out.read_text()
    assert no_temp_files(tmp_path)


def test_cli_one_sidecar_bills_every_node(cloud, tmp_path, monkeypatch):
    """A 2-node job on Lambda: the head node's sidecar reads its own instance ($1.10/h) and writes the bill of
    both machines (rate and disk line times 2), so the trainer's cap guards the sum."""
    state, base = cloud
    state.reply("/api/v1/instances", lambda_body(("a", "active", 110)))
    monkeypatch.setenv("LAMBDA_API_KEY", KEY)
    out = tmp_path / "budget.json"
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    assert (
        bs_cli.main(
            [
                "--provider",
                "lambda",
                "--provider-base-url",
                base,
                "--out",
                str(out),
                "--once",
                "--nodes",
                "2",
                "--started-utc",
                utc(start),
            ]
        )
        == 0
    )
    b = json.loads(out.read_text())
    assert b["rate_usd_per_hr"] == pytest.approx(2.20) and b["fixed_usd"] == {"disk_usd": 4.0, "egress_usd": 1.0}
    assert b["spent_usd"] == pytest.approx(2 * 1.10 * 2 + 4 + 1, abs=0.02)
    assert b["resource_id"] == "a x2 nodes"
    assert (
        bs_cli.main(["--provider", "clock", "--rate-usd-per-hr", "1", "--nodes", "0", "--out", str(out), "--once"]) == 2
    )  # usage


def test_the_provider_registry_drives_both_commands_flags():
    """A provider is one module and one entry of providers.APIS: the sidecar's --provider and id flags and the
    watchdog's --terminate-on-exit and id flags come from it, and each API answers with its own reading."""
    from x1_pretrain import budget_sidecar
    from x1_pretrain import watchdog as watchdog_cmd

    side, wd = budget_sidecar.build_parser().format_help(), watchdog_cmd.build_parser().format_help()
    assert set(pv.PROVIDERS) == {*pv.APIS, pv.CLOCK} and "{lambda,runpod,clock}" in side.replace(" ", "")
    assert "--terminate-on-exit {lambda,runpod}" in wd
    for api in pv.APIS.values():
        assert (
            api.id_flag in side and api.id_flag in wd and api.name in (api.read.__module__ or "").replace("_cloud", "")
        )
