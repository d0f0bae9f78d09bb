"""Alerts by Slack incoming webhook and SMTP email, configured from the environment. Stdlib only.

    X1_SLACK_WEBHOOK_URL   https://hooks.slack.com/services/...   (a secret: only its host is ever shown)
    X1_SMTP_HOST           smtp.example.com                        (enables email)
    X1_SMTP_PORT           587 (default)
    X1_SMTP_STARTTLS       true (default) | false                  (false: plain SMTP, e.g. a local relay)
    X1_SMTP_USER           login name; no login when unset
    X1_SMTP_PASSWORD       (a secret: never shown)
    X1_SMTP_FROM           sender (default: X1_SMTP_USER, else x1-pretrain@localhost)
    X1_SMTP_TO             comma-separated recipients (required with X1_SMTP_HOST)
    X1_SMTP_CA_FILE        optional PEM bundle to trust for STARTTLS (a private relay's CA)

``Alerter.send`` never raises: each channel maps to None (delivered) or a short, redacted error,
and each failure is a warning on stderr (``budget.alerts``). A misconfigured channel (e.g.
X1_SMTP_HOST without X1_SMTP_TO) is listed and reports its problem on every send, so a pre-launch
test (``python -m x1_pretrain.alerts test``) shows it before money is spent.
"""

from __future__ import annotations

import argparse
import sys

from .budget.alerts import from_env
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.alerts", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_log_level(p)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("test", help="send a TEST alert to every configured channel")
    t.add_argument("--message", default="Alert channels work.")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    alerter = from_env()
    if not alerter.channels():
        print(
            "error: no alert channel configured; set X1_SLACK_WEBHOOK_URL and/or X1_SMTP_HOST and X1_SMTP_TO",
            file=sys.stderr,
        )
        return 2
    results = alerter.send("alert channel test", args.message, test=True)
    for name, err in results.items():
        print(f"[alerts] {name}: {'ok' if err is None else err}")
    return 0 if all(err is None for err in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
