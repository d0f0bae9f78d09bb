"""Alerts against real local servers: an HTTP server standing in for Slack, an SMTP server (aiosmtpd)
with STARTTLS and a certificate made here, and ports where nothing listens."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from email import message_from_bytes
from email.policy import default as default_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from x1_pretrain import alerts as alerts_cli
from x1_pretrain.budget import alerts

aiosmtpd_controller = pytest.importorskip("aiosmtpd.controller")
aiosmtpd_smtp = pytest.importorskip("aiosmtpd.smtp")

WEBHOOK_SECRET = "T0000/B0000/XXXXsecretXXXXwebhook"
PASSWORD = "hunter2-very-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- a Slack stand-in ---------------------------------------------------------------------------------
class Slack:
    def __init__(self) -> None:
        self.posts: list[tuple[str, dict]] = []
        self.status = 200


@pytest.fixture
def slack() -> Iterator[tuple[Slack, str]]:
    state = Slack()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.headers["Content-Type"] == "application/json"
            state.posts.append((self.path, json.loads(body)))
            reply = b"ok" if state.status == 200 else b"no_service"
            self.send_response(state.status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args) -> None:  # keep test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/services/{WEBHOOK_SECRET}"
    finally:
        server.shutdown()
        server.server_close()


# --- an SMTP server with STARTTLS ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("x1 test CA"))
        .issuer_name(name("x1 test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    d = tmp_path_factory.mktemp("tls")
    (d / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return d / "ca.pem", d / "cert.pem", d / "key.pem"


class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], bytes, bool]] = []

    async def handle_DATA(self, server, session, envelope) -> str:
        self.messages.append(
            (envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content, session.ssl is not None)
        )
        return "250 OK"


def check_password(server, session, envelope, mechanism, auth_data):
    ok = auth_data.login == b"x1bot" and auth_data.password == PASSWORD.encode()
    return aiosmtpd_smtp.AuthResult(success=ok, handled=False)


@pytest.fixture
def smtp_server(request, tls_files) -> Iterator[tuple[Inbox, int]]:
    """Plain by default; ``@pytest.mark.parametrize("smtp_server", ["starttls"], indirect=True)`` for TLS."""
    inbox = Inbox()
    port = free_port()
    kwargs: dict = {}
    if getattr(request, "param", "plain") == "starttls":
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(tls_files[1], tls_files[2])
        kwargs = {
            "tls_context": ctx,
            "require_starttls": True,
            "authenticator": check_password,
            "auth_require_tls": True,
        }
    controller = aiosmtpd_controller.Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def smtp_env(port: int, **extra: str) -> dict[str, str]:
    return {
        "X1_SMTP_HOST": "127.0.0.1",
        "X1_SMTP_PORT": str(port),
        "X1_SMTP_FROM": "x1@example.org",
        "X1_SMTP_TO": "ops@example.org, oncall@example.org",
        **extra,
    }


def parse(raw: bytes):
    return message_from_bytes(raw, policy=default_policy)


# --- tests --------------------------------------------------------------------------------------------
def test_no_environment_means_no_channels():
    a = alerts.from_env({})
    assert a.channels() == []
    assert a.send("s", "b") == {}


def test_slack_webhook_receives_the_json_text(slack):
    state, url = slack
    a = alerts.from_env({"X1_SLACK_WEBHOOK_URL": url})
    assert a.channels() == ["slack"]
    assert a.send("budget at $30.10", "spent 30.10 of 35.00 USD") == {"slack": None}
    ((path, body),) = state.posts
    assert path == f"/services/{WEBHOOK_SECRET}"
    assert set(body) == {"text"}
    assert "[x1] budget at $30.10" in body["text"] and "spent 30.10 of 35.00 USD" in body["text"]
    assert "TEST" not in body["text"]


def test_test_messages_are_marked(slack):
    state, url = slack
    assert alerts.from_env({"X1_SLACK_WEBHOOK_URL": url}).send("hello", "body", test=True) == {"slack": None}
    assert "[x1 TEST] hello" in state.posts[0][1]["text"]


def test_slack_error_status_is_reported_without_the_secret(slack, capsys):
    state, url = slack
    state.status = 404
    result = alerts.from_env({"X1_SLACK_WEBHOOK_URL": url}).send("s", "b")
    err = capsys.readouterr().err
    assert result["slack"] is not None and "404" in result["slack"]
    assert "WARNING budget.alerts: slack" in err and "127.0.0.1" in err
    assert WEBHOOK_SECRET not in err and WEBHOOK_SECRET not in result["slack"] and "services" not in err


@pytest.mark.parametrize("smtp_server", ["starttls"], indirect=True)
def test_email_over_starttls_with_login(smtp_server, tls_files, capsys):
    inbox, port = smtp_server
    env = smtp_env(port, X1_SMTP_USER="x1bot", X1_SMTP_PASSWORD=PASSWORD, X1_SMTP_CA_FILE=str(tls_files[0]))
    a = alerts.from_env(env)
    assert a.channels() == ["email"]
    assert a.send("budget at $30.10", "spent 30.10 of 35.00 USD", test=True) == {"email": None}
    ((mail_from, rcpt, raw, over_tls),) = inbox.messages
    assert over_tls
    assert mail_from == "x1@example.org"
    assert rcpt == ["ops@example.org", "oncall@example.org"]
    msg = parse(raw)
    assert msg["Subject"] == "[x1 TEST] budget at $30.10"
    assert msg["From"] == "x1@example.org"
    assert msg["To"] == "ops@example.org, oncall@example.org"
    assert "spent 30.10 of 35.00 USD" in msg.get_content() and "TEST" in msg.get_content()
    assert PASSWORD not in capsys.readouterr().err


@pytest.mark.parametrize("smtp_server", ["starttls"], indirect=True)
def test_wrong_password_is_an_error_that_hides_it(smtp_server, tls_files, capsys):
    inbox, port = smtp_server
    wrong = "not-the-password-123"
    env = smtp_env(port, X1_SMTP_USER="x1bot", X1_SMTP_PASSWORD=wrong, X1_SMTP_CA_FILE=str(tls_files[0]))
    result = alerts.from_env(env).send("s", "b")
    err = capsys.readouterr().err
    assert result["email"] is not None and "SMTPAuthenticationError" in result["email"]
    assert "WARNING budget.alerts: email (127.0.0.1:" in err
    assert wrong not in err and wrong not in result["email"]
    assert inbox.messages == []


@pytest.mark.parametrize("smtp_server", ["starttls"], indirect=True)
def test_starttls_refuses_an_untrusted_certificate(smtp_server):
    inbox, port = smtp_server
    result = alerts.from_env(smtp_env(port, X1_SMTP_USER="x1bot", X1_SMTP_PASSWORD=PASSWORD)).send("s", "b")
    assert result["email"] is not None and "CERTIFICATE_VERIFY_FAILED" in result["email"]
    assert PASSWORD not in result["email"]
    assert inbox.messages == []


def test_plain_email_when_starttls_is_off(smtp_server):
    inbox, port = smtp_server
    a = alerts.from_env(smtp_env(port, X1_SMTP_STARTTLS="false"))
    assert a.send("subject line", "body text") == {"email": None}
    ((_, rcpt, raw, over_tls),) = inbox.messages
    assert not over_tls and rcpt == ["ops@example.org", "oncall@example.org"]
    msg = parse(raw)
    assert msg["Subject"] == "[x1] subject line" and "body text" in msg.get_content()


def test_closed_ports_return_errors_and_do_not_raise(capsys):
    port = free_port()  # nothing listens here
    env = {
        "X1_SLACK_WEBHOOK_URL": f"http://127.0.0.1:{port}/services/{WEBHOOK_SECRET}",
        **smtp_env(port, X1_SMTP_USER="x1bot", X1_SMTP_PASSWORD=PASSWORD),
    }
    a = alerts.from_env(env)
    assert a.channels() == ["slack", "email"]
    result = a.send("s", "b")
    assert set(result) == {"slack", "email"}
    assert all(v is not None and "Refused" in v for v in result.values()), result
    err = capsys.readouterr().err
    assert err.count("WARNING budget.alerts: ") == 2
    for secret in (WEBHOOK_SECRET, PASSWORD):
        assert secret not in err and all(secret not in v for v in result.values() if v)


def test_one_failing_channel_does_not_stop_the_other(smtp_server):
    inbox, port = smtp_server
    env = {
        "X1_SLACK_WEBHOOK_URL": f"http://127.0.0.1:{free_port()}/services/{WEBHOOK_SECRET}",
        **smtp_env(port, X1_SMTP_STARTTLS="false"),
    }
    result = alerts.from_env(env).send("s", "b")
    assert result["slack"] is not None and result["email"] is None
    assert len(inbox.messages) == 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"X1_SMTP_TO": ""}, "X1_SMTP_TO"),
        ({"X1_SMTP_PORT": "smtp"}, "X1_SMTP_PORT"),
        ({"X1_SMTP_STARTTLS": "maybe"}, "X1_SMTP_STARTTLS"),
    ],
)
def test_misconfigured_email_is_listed_and_explains_itself(extra, needle, capsys):
    a = alerts.from_env({**smtp_env(free_port()), **extra})
    assert a.channels() == ["email"]
    result = a.send("s", "b")
    assert result["email"] is not None and needle in result["email"]
    assert needle in capsys.readouterr().err


def test_defaults_from_environment():
    a = alerts.from_env({"X1_SMTP_HOST": "mail.example.org", "X1_SMTP_TO": "a@b.c", "X1_SMTP_USER": "me@b.c"})
    (ch,) = a.configured
    assert isinstance(ch, alerts.SmtpChannel)
    assert (ch.port, ch.starttls, ch.sender, ch.recipients, ch.password) == (587, True, "me@b.c", ("a@b.c",), None)


def test_cli_test_command(slack, monkeypatch, capsys):
    state, url = slack
    monkeypatch.setenv("X1_SLACK_WEBHOOK_URL", url)
    for k in ("X1_SMTP_HOST",):
        monkeypatch.delenv(k, raising=False)
    assert alerts_cli.main(["test"]) == 0
    assert "[x1 TEST]" in state.posts[0][1]["text"]
    assert WEBHOOK_SECRET not in capsys.readouterr().out
    monkeypatch.delenv("X1_SLACK_WEBHOOK_URL")
    assert alerts_cli.main(["test"]) == 2
