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
from x1_pretrain.budget import sidecar as bs

from ..conftest import REPO

KEY = "sk-test-SECRETKEY-4f9a7c"
T0 = datetime(2026, 5, 23, 3, 0, 0, tzinfo=timezone.utc)


def lambda_body(*instances: tuple[str, str, int]) -> dict:
    return {"data": [{"id": i, "status": s, "name": "x1", "instance_type": {"name": "gpu_1x_a100_sxm4",
                                                                             "price_cents_per_hour": c}}
                     for i, s, c in instances]}


def runpod_body(*pods: tuple[str, str, float, float | None]) -> dict:
    return {"data": {"myself": {"pods": [
        {"id": i, "name": "x1", "costPerHr": c, "desiredStatus": s,
         "runtime": None if up is None else {"uptimeInSeconds": up}} for i, s, c, up in pods]}}}


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
            state.requests.append((self.command, self.path, self.headers.get("Authorization"),
                                   self.rfile.read(length)))
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


def api_sidecar(provider: str, base: str, out: Path, clock: Clock, timeout_s: float = 0.5,
                resource_id: str | None = None) -> bs.Sidecar:
    source = bs.ApiSource(provider, base, KEY, bs.DEFAULT_KEY_ENV[provider], timeout_s, resource_id)
    return bs.Sidecar(source, out, started=T0, planned_hours=24.0, now=clock)


def no_temp_files(d: Path) -> bool:
    return all(".tmp" not in p.name for p in d.iterdir())


# --- pure functions -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("body", "wanted", "rate", "rid"), [
    (LAMBDA_OK, None, 1.10, "inst-a"),
    (lambda_body(("a", "active", 110), ("b", "booting", 129)), "b", 1.29, "b"),
    (lambda_body(("a", "terminated", 110)), "a", 1.10, "a"),
    (lambda_body(("a", "unhealthy", 75)), None, 0.75, "a"),
])
def test_parse_lambda(body, wanted, rate, rid):
    r = bs.parse_lambda(body, wanted)
    assert (r.rate_usd_per_hr, r.uptime_s, r.resource_id) == (pytest.approx(rate), None, rid)


@pytest.mark.parametrize(("body", "wanted", "error", "needle"), [
    (lambda_body(("a", "active", 110), ("b", "active", 110)), None, bs.SelectionError, "--instance-id"),
    (lambda_body(("a", "terminated", 110)), None, bs.SelectionError, "no running instance"),
    (LAMBDA_OK, "nope", bs.SelectionError, "inst-a, inst-old"),
    ({"data": [{"id": "a", "status": "active", "instance_type": {"name": "x"}}]}, None, bs.PollError,
     "data[0].instance_type.price_cents_per_hour"),
    ({"data": [{"id": "a", "status": "active"}]}, None, bs.PollError, "data[0].instance_type"),
    ({"data": [{"id": "a", "status": "active", "instance_type": {"price_cents_per_hour": "110"}}]}, None,
     bs.PollError, "not a non-negative number"),
    ({"data": {"id": "a"}}, None, bs.PollError, "not a list"),
    ({"error": {"code": "global/invalid-api-key"}}, None, bs.PollError, "body.data"),
    ([1, 2], None, bs.PollError, "body.data"),
])
def test_parse_lambda_errors(body, wanted, error, needle):
    with pytest.raises(error) as e:
        bs.parse_lambda(body, wanted)
    assert needle in str(e.value)


@pytest.mark.parametrize(("body", "wanted", "rate", "uptime", "rid"), [
    (RUNPOD_OK, None, 0.79, 7200.0, "pod-a"),
    (runpod_body(("p", "RUNNING", 0.79, None)), None, 0.79, None, "p"),
    (runpod_body(("p", "RUNNING", 1, 0), ("q", "RUNNING", 2, 60)), "q", 2.0, 60.0, "q"),
])
def test_parse_runpod(body, wanted, rate, uptime, rid):
    r = bs.parse_runpod(body, wanted)
    assert (r.rate_usd_per_hr, r.uptime_s, r.resource_id) == (pytest.approx(rate), uptime, rid)


@pytest.mark.parametrize(("body", "error", "needle"), [
    ({"errors": [{"message": "Not authorized"}], "data": None}, bs.PollError, "Not authorized"),
    (runpod_body(("p", "RUNNING", 1, 0), ("q", "RUNNING", 2, 60)), bs.SelectionError, "--pod-id"),
    ({"data": {"myself": {"pods": [{"id": "p", "desiredStatus": "RUNNING"}]}}}, bs.PollError, "pods[0].costPerHr"),
    ({"data": {"myself": None}}, bs.PollError, "body.data.myself"),
    ({"data": None}, bs.PollError, "body.data"),
    (runpod_body(("p", "RUNNING", -1.0, 5)), bs.PollError, "costPerHr"),
])
def test_parse_runpod_errors(body, error, needle):
    with pytest.raises(error) as e:
        bs.parse_runpod(body)
    assert needle in str(e.value)
    if error is bs.PollError and "errors" in body:
        assert e.value.kind == "API error"


@pytest.mark.parametrize(("uptime", "now", "planned", "spent", "hours", "projected"), [
    (None, T0 + timedelta(hours=2), 24.0, 2.2, 2.0, 26.4),          # hours from the start
    (7200.0, T0 + timedelta(hours=9), 24.0, 2.2, 2.0, 26.4),        # the provider's uptime wins
    (None, T0 - timedelta(hours=1), 24.0, 0.0, 0.0, 26.4),          # a start in the future counts as 0
    (None, T0 + timedelta(hours=30), 24.0, 33.0, 30.0, 33.0),       # past the plan: projected = spent
    (None, T0 + timedelta(minutes=30), 10.0, 0.55, 0.5, 11.0),
])
def test_build_budget(uptime, now, planned, spent, hours, projected):
    b = bs.build_budget(bs.Reading(1.10, uptime, "inst-a"), now=now, started=T0, planned_hours=planned,
                        provider="lambda")
    assert b["spent_usd"] == pytest.approx(spent)
    assert b["hours_elapsed"] == pytest.approx(hours)
    assert b["projected_total_usd"] == pytest.approx(projected)
    assert b["rate_usd_per_hr"] == pytest.approx(1.10)
    assert b["last_update_utc"] == now.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert b["started_utc"] == "2026-05-23T03:00:00Z"


@pytest.mark.parametrize("text", ["2026-05-23T03:00:00Z", "2026-05-23T03:00:00", "2026-05-23T05:00:00+02:00",
                                  "2026-05-23 03:00:00+00:00"])
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
    guard = pytest.importorskip("x1_pretrain.budget_guard")
    out = tmp_path / "budget.json"
    side = bs.Sidecar(bs.ClockSource(1.10), out, started=T0, planned_hours=24.0, now=Clock(T0 + timedelta(hours=3)))
    assert side.poll()
    reading = guard.parse(json.loads(out.read_text()))
    assert reading.problem is None
    assert reading.snapshot.spent_usd == pytest.approx(3.3)
    assert reading.snapshot.last_update_utc == T0 + timedelta(hours=3)


def test_runpod_poll_uses_graphql_and_uptime(cloud, tmp_path):
    state, base = cloud
    out = tmp_path / "budget.json"
    assert api_sidecar("runpod", base, out, Clock(T0 + timedelta(hours=5))).poll()
    b = json.loads(out.read_text())
    assert b["rate_usd_per_hr"] == pytest.approx(0.79)
    assert b["hours_elapsed"] == pytest.approx(2.0)
    assert b["spent_usd"] == pytest.approx(1.58)
    ((method, path, auth, body),) = state.requests
    assert (method, path, auth) == ("POST", "/graphql", f"Bearer {KEY}")
    assert json.loads(body) == {"query": bs.RUNPOD_QUERY}


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
def test_a_failed_poll_leaves_budget_json_alone(cloud, tmp_path, capsys, provider, path, body, status, delay,
                                                kind):
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
    assert err.startswith(f"[budget_sidecar] {provider}: {kind}")
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
    source = bs.ApiSource("lambda", base, bad, "LAMBDA_API_KEY", 0.5)
    side = bs.Sidecar(source, tmp_path / "budget.json", started=T0, planned_hours=24.0, now=Clock(T0))
    assert not side.poll()
    err = capsys.readouterr().err
    assert "lambda: network error" in err and bad not in err


# --- start time ---------------------------------------------------------------------------------------
def test_the_recorded_start_survives_a_restart(tmp_path):
    out = tmp_path / "budget.json"
    started, origin = bs.resolve_start(out, None, T0)
    assert started == T0 and "first start" in origin
    assert json.loads((tmp_path / "budget.json.start").read_text()) == {"started_utc": "2026-05-23T03:00:00Z"}
    started, origin = bs.resolve_start(out, None, T0 + timedelta(hours=3))
    assert started == T0 and origin.endswith("budget.json.start")
    started, _ = bs.resolve_start(out, "2026-05-22T21:00:00Z", T0)  # an explicit start wins and is recorded
    assert started == T0 - timedelta(hours=6)
    assert bs.resolve_start(out, None, T0)[0] == T0 - timedelta(hours=6)
    assert no_temp_files(tmp_path)


def test_an_unreadable_start_file_is_a_usage_error(tmp_path):
    (tmp_path / "budget.json.start").write_text("garbage")
    with pytest.raises(bs.X1Error, match="delete it"):
        bs.resolve_start(tmp_path / "budget.json", None, T0)


# --- CLI ----------------------------------------------------------------------------------------------
def utc(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_cli_clock_once(tmp_path):
    out = tmp_path / "budget.json"
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    code = bs_cli.main(["--provider", "clock", "--rate-usd-per-hr", "1.10", "--out", str(out),
                    "--started-utc", utc(start), "--planned-hours", "10", "--once"])
    assert code == 0
    b = json.loads(out.read_text())
    assert b["hours_elapsed"] == pytest.approx(2.0, abs=0.01)
    assert b["spent_usd"] == pytest.approx(2.2, abs=0.02)
    assert b["projected_total_usd"] == pytest.approx(11.0, abs=0.001)
    assert b["provider"] == "clock" and b["planned_hours"] == 10
    assert abs(bs.parse_utc(b["last_update_utc"]) - datetime.now(timezone.utc)) < timedelta(seconds=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json", "budget.json.start"]


def test_cli_once_keeps_the_recorded_start(tmp_path):
    out = tmp_path / "budget.json"
    args = ["--provider", "clock", "--rate-usd-per-hr", "2", "--out", str(out), "--once"]
    assert bs_cli.main(args) == 0
    first = json.loads(out.read_text())["started_utc"]
    (tmp_path / "budget.json.start").write_text(json.dumps({"started_utc": "2020-01-01T00:00:00Z"}))
    assert bs_cli.main(args) == 0
    assert first != "2020-01-01T00:00:00Z"
    assert json.loads(out.read_text())["started_utc"] == "2020-01-01T00:00:00Z"


def test_cli_lambda_once_and_its_exit_codes(cloud, tmp_path, monkeypatch, capsys):
    state, base = cloud
    monkeypatch.setenv("LAMBDA_API_KEY", KEY)
    out = tmp_path / "budget.json"
    args = ["--provider", "lambda", "--base-url", base, "--out", str(out), "--once", "--timeout-s", "0.3"]
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
    assert bs_cli.main(["--provider", "runpod", "--base-url", base, "--api-key-env", "MY_RUNPOD_KEY",
                    "--pod-id", "pod-a", "--out", str(out), "--once"]) == 0
    assert json.loads(out.read_text())["resource_id"] == "pod-a"


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["--provider", "lambda"], {}, "LAMBDA_API_KEY"),
    (["--provider", "runpod"], {}, "RUNPOD_API_KEY"),
    (["--provider", "runpod", "--api-key-env", "NOPE_KEY"], {}, "NOPE_KEY"),
    (["--provider", "aws"], {}, "invalid choice"),
    (["--provider", "clock"], {}, "--rate-usd-per-hr"),
    (["--provider", "clock", "--rate-usd-per-hr", "-1"], {}, "--rate-usd-per-hr must be a positive"),
    (["--provider", "clock", "--rate-usd-per-hr", "1", "--interval-min", "0"], {}, "--interval-min"),
    (["--provider", "clock", "--rate-usd-per-hr", "1", "--started-utc", "yesterday"], {}, "--started-utc"),
    (["--provider", "lambda", "--pod-id", "p"], {"LAMBDA_API_KEY": KEY}, "--instance-id"),
    (["--provider", "lambda", "--base-url", "{base}"], {"LAMBDA_API_KEY": KEY}, "--instance-id ID"),
    (["--provider", "lambda", "--base-url", "{base}", "--instance-id", "x"], {"LAMBDA_API_KEY": KEY}, "no such"),
])
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
    cmd = [sys.executable, "-m", "x1_pretrain.budget_sidecar", "--provider", "lambda", "--base-url", base,
           "--out", str(out), "--interval-min", "0.001", "--timeout-s", "2"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
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
