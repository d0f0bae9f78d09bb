"""The multi-node budget.json server: one file, to bearer-token holders only, on a real socket on 127.0.0.1;
the budget source sends the token from the environment; the command serves until SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from x1_pretrain.budget import serve
from x1_pretrain.budget.source import read_source
from x1_pretrain.core.errors import X1Error

from ..conftest import REPO
from ..s3server import free_port
from ..servers import wait_until

TOKEN = "tok-" + "9" * 28
READING = {
    "spent_usd": 3.5,
    "rate_usd_per_hr": 1.1,
    "hours_elapsed": 2,
    "projected_total_usd": 20.0,
    "last_update_utc": "2026-05-23T15:42:01Z",
}


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def served(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(READING))
    server = serve.BudgetServer(path, TOKEN, "127.0.0.1", 0).start()
    yield server, path
    server.close()


def test_no_token_or_a_wrong_one_is_401_the_right_one_gets_the_reading(served):
    server, path = served
    assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/budget.json")
    assert _get(server.url)[0] == 401
    assert _get(server.url, TOKEN[:-1] + "x")[0] == 401
    assert _get(server.url, TOKEN + "x")[0] == 401
    code, body = _get(server.url, TOKEN)
    assert code == 200 and json.loads(body) == READING
    base = server.url.rsplit("/", 1)[0]
    assert _get(base + "/", TOKEN)[0] == 404 and _get(base + "/../budget.json.bak", TOKEN)[0] == 404
    assert _get(base + "/other.json")[0] == 401  # nothing is said to a stranger, not even what exists
    path.write_text(json.dumps({**READING, "spent_usd": 4.0}))  # read again for every request
    assert json.loads(_get(server.url, TOKEN)[1])["spent_usd"] == 4.0
    path.unlink()
    assert _get(server.url, TOKEN)[0] == 503


def test_the_budget_source_sends_the_token_from_the_environment(served, monkeypatch, tmp_path):
    server, _ = served
    monkeypatch.delenv(serve.TOKEN_ENV, raising=False)
    monkeypatch.delenv(serve.TOKEN_FILE_ENV, raising=False)
    r = read_source(server.url)
    assert r.snapshot is None and "HTTP 401" in r.problem and serve.TOKEN_ENV in r.problem
    monkeypatch.setenv(serve.TOKEN_ENV, TOKEN)
    assert read_source(server.url).snapshot.spent_usd == 3.5
    monkeypatch.delenv(serve.TOKEN_ENV)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.setenv(serve.TOKEN_FILE_ENV, str(token_file))
    assert read_source(server.url).snapshot.spent_usd == 3.5
    token_file.unlink()
    r = read_source(server.url)
    assert r.snapshot is None and str(token_file) in r.problem and TOKEN not in r.problem


def test_tokens_short_or_missing_are_refused_and_derived_ones_agree():
    with pytest.raises(X1Error, match="at least 16"):
        serve.check_token("short")
    with pytest.raises(X1Error, match="at least 16"):
        serve.check_token(None)
    env = {"LAMBDA_API_KEY": "k-1", "SKYPILOT_TASK_ID": "job-7"}
    a, b = serve.derive_token(env), serve.derive_token(dict(env))
    assert a == b and len(a) == 64 and "k-1" not in a
    assert serve.derive_token({**env, "SKYPILOT_TASK_ID": "job-8"}) != a
    assert serve.derive_token({**env, "LAMBDA_API_KEY": "k-2"}) != a
    with pytest.raises(X1Error, match="X1_BUDGET_TOKEN"):
        serve.derive_token({"SKYPILOT_TASK_ID": "job-7"})


def test_the_command_serves_until_sigterm_and_needs_a_token(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(READING))
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "x1_pretrain.budget_serve",
        "--file",
        str(path),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {k: v for k, v in os.environ.items() if k not in (serve.TOKEN_ENV, serve.TOKEN_FILE_ENV)}
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at least 16" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "token").write_text(TOKEN)
    proc = subprocess.Popen(
        [*cmd, "--token-file", str(tmp_path / "token")], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}/budget.json"
        assert wait_until(lambda: proc.poll() is not None or _answers(url), timeout=30)
        assert _get(url)[0] == 401 and json.loads(_get(url, TOKEN)[1]) == READING
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "bearer token required" in err and TOKEN not in err


def _answers(url: str) -> bool:
    try:
        return _get(url)[0] == 401
    except OSError:
        return False
