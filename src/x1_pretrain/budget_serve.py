"""Serve the billing sidecar's budget.json to the other nodes of a cluster, to bearer-token holders only.

    X1_BUDGET_TOKEN=... python -m x1_pretrain.budget_serve --file /workspace/budget.json \\
        --bind 10.0.0.5 --port 8799

Only that one file is served, at /budget.json (its name), and only to a request with
``Authorization: Bearer <token>``; anything else is 401 (404 for another path). The token comes from
--token-file, $X1_BUDGET_TOKEN or $X1_BUDGET_TOKEN_FILE, never from a flag (a flag is visible in ps); the
readers (train, watchdog) send it from the same variables. --derive-token prints the token every node of
one SkyPilot task computes from the task's secrets (deploy/skypilot.yaml uses it). Bind to the cluster's
private address, never 0.0.0.0 on a machine with a public one. Runs until SIGTERM/SIGINT (exit 0); exit 2
for bad usage (no token, an address it cannot listen on).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from .budget.serve import BudgetServer, check_token, derive_token, token_from_env
from .core.cli import guarded
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.budget_serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument("--file", type=Path, help="the budget.json to serve (the sidecar's --out)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        help="the address to listen on: the cluster's private address (default 127.0.0.1)",
    )
    p.add_argument("--port", type=int, default=8799, help="the port (default 8799; 0: any free port)")
    p.add_argument(
        "--token-file",
        type=Path,
        help="a file holding the bearer token (default: $X1_BUDGET_TOKEN, then $X1_BUDGET_TOKEN_FILE)",
    )
    p.add_argument(
        "--derive-token", action="store_true", help="print the token derived from this SkyPilot task's secrets and exit"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, info_to="stderr")  # a background process: its lines on stderr

    def body() -> int:
        if args.derive_token:
            print(derive_token())
            return 0
        if args.file is None:
            build_parser().error("--file is required (the budget.json to serve)")
        server = BudgetServer(args.file, check_token(token_from_env(token_file=args.token_file)), args.bind, args.port)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        server.start()
        print(
            f"[budget_serve] serving {args.file} at {server.url} (bearer token required)", file=sys.stderr, flush=True
        )
        while not stop.wait(0.5):
            pass
        server.close()
        return 0

    return guarded(body)


if __name__ == "__main__":
    raise SystemExit(main())
