from __future__ import annotations

from x1_pretrain.core import redact


def test_userinfo_query_values_and_fragments_are_masked():
    url = "https://alice:pa55word@billing.example.com:8443/budget.json?token=abc123secret&x=1#frag"
    shown = redact.url(url)
    assert shown == "https://***@billing.example.com:8443/budget.json?token=***&x=***#***"
    for secret in ("alice", "pa55word", "abc123secret"):
        assert secret not in shown


def test_paths_and_plain_urls_are_unchanged():
    assert redact.url("/workspace/budget.json") == "/workspace/budget.json"
    assert redact.url("file:///workspace/mlruns") == "file:///workspace/mlruns"
    assert redact.url("http://host:5000") == "http://host:5000"
    assert redact.url("sqlite:////tmp/c/mlflow.db") == "sqlite:////tmp/c/mlflow.db"
    assert redact.url(None) is None


def test_free_text_is_scrubbed_of_a_urls_secrets():
    url = "http://u:topsecret@h/b.json?token=abcdef"
    msg = "HTTPError: 401 for http://u:topsecret@h/b.json?token=abcdef (token abcdef rejected)"
    out = redact.scrub(msg, url)
    assert "topsecret" not in out and "abcdef" not in out and "401" in out


def test_a_url_flag_with_a_secret_is_warned_once_masked_naming_the_alternative(monkeypatch, capsys):
    monkeypatch.setattr(redact, "_warned", set())
    assert not redact.warn_if_visible("--mlflow-uri", "http://host:5000/", redact.MLFLOW_CREDENTIALS)
    assert not redact.warn_if_visible("--mlflow-uri", "file:///tmp/mlruns", redact.MLFLOW_CREDENTIALS)
    assert capsys.readouterr().err == ""
    url = "http://alice:pa55word@host:5000/"
    assert redact.warn_if_visible("--mlflow-uri", url, redact.MLFLOW_CREDENTIALS)
    assert not redact.warn_if_visible("--mlflow-uri", url, redact.MLFLOW_CREDENTIALS)  # once
    assert redact.warn_if_visible("--budget-curr-cost-uri", "https://h/b.json?token=abcdef", redact.BUDGET_CREDENTIALS)
    err = capsys.readouterr().err
    assert err.count(" WARNING core.redact: ") == 2 and "pa55word" not in err and "abcdef" not in err
    assert "--mlflow-uri http://***@host:5000/ carries a secret" in err and "(ps)" in err
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in err and "X1_BUDGET_TOKEN" in err
