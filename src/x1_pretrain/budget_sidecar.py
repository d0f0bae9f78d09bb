"""Poll the cloud's billing API (or a clock) and keep budget.json up to date for the budget guard.

    python -m x1_pretrain.budget_sidecar --provider lambda --out /workspace/budget.json --interval-min 5
    python -m x1_pretrain.budget_sidecar --provider runpod --out budget.json --pod-id abc123
    python -m x1_pretrain.budget_sidecar --provider clock --rate-usd-per-hr 1.10 --out budget.json

budget.json (written atomically): spent_usd (= compute so far + the fixed lines), rate_usd_per_hr,
hours_elapsed, projected_total_usd (= spent + rate × the hours left of --planned-hours), last_update_utc,
plus compute_usd, fixed_usd (--disk-usd, --egress-usd: the lab's $2 and $1), provider, resource_id,
started_utc, started_from and planned_hours.

Spend is integrated, not multiplied: every poll adds rate × (time since the previous poll) to a total kept
in OUT.state, so a price change never rewrites past hours and a pod restart never resets it; the interval
is charged at the higher of the old and new rate. Counting starts when billing started: --started-utc, else
the provider's uptime (RunPod), else this machine's boot time (a cloud VM: image pull, set-up and tokenizing
are billed too), and budget.json says which (started_from). A restarted sidecar goes on from OUT.state.

  lambda  GET {base}/api/v1/instances; rate = price_cents_per_hour / 100.
  runpod  GraphQL {base}/graphql; rate = the pod's costPerHr; the account's clientBalance is the real money:
          its fall since the first poll is cross-checked against the integrated total and the higher is used.
  clock   a fixed --rate-usd-per-hr, no network.

--nodes N (a multi-node job: N identical machines launched together): the one sidecar on the head node bills
them all, its machine's rate and the --disk-usd line times N, so the trainer's cap guards the sum.

When a poll fails (network, a server that answers slowly or never: every request has a total deadline of
--timeout-s, HTTP status, malformed answer, GraphQL errors) budget.json is left as it was, so the guard
sees its age; one line goes to stderr and polling goes on. The API key is read from an environment
variable and never printed or written.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from .budget.providers import APIS, CLOCK, PROVIDERS, ApiSource, ClockSource, NodesSource
from .budget.sidecar import BudgetAsk, FixedLines, Sidecar, load_state
from .core.cli import guarded, old_spelling
from .core.console import guarded_console
from .core.contract import EXIT_OK, EXIT_UNEXPECTED, EXIT_USAGE
from .core.errors import X1Error
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m x1_pretrain.budget_sidecar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_level(p)
    p.add_argument("--provider", required=True, choices=PROVIDERS)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("budget.json"),
        help="budget.json to keep up to date (the trainer's and watchdog's --budget-curr-cost-uri)",
    )
    p.add_argument(
        "--interval-min",
        type=float,
        default=5.0,
        help="minutes between polls (fractions allowed; "
        "tell the trainer with --budget-sidecar-interval-min, which judges staleness by it)",
    )
    p.add_argument("--rate-usd-per-hr", type=float, default=None, help="hourly rate (required for clock)")
    p.add_argument(
        "--started-utc",
        default=None,
        help="when billing started (ISO time, or 'now'); default: the provider's uptime, else boot time",
    )
    p.add_argument("--planned-hours", type=float, default=24.0, help="run length for projected_total_usd")
    p.add_argument("--disk-usd", type=float, default=2.0, help="the persistent disk line (default: the lab's $2)")
    p.add_argument("--egress-usd", type=float, default=1.0, help="the data egress line (default: the lab's $1)")
    old_spelling(
        p,
        "--base-url",
        p.add_argument(
            "--provider-base-url",
            default=None,
            help="provider API base URL (default: the provider's; the watchdog's --provider-base-url; was --base-url)",
        ),
    )
    p.add_argument(
        "--api-key-env", default=None, help="env var holding the API key (default: LAMBDA_API_KEY / RUNPOD_API_KEY)"
    )
    for api in APIS.values():
        p.add_argument(api.id_flag, default=None, help=api.id_help())
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="machines of a multi-node job, identical and launched together: one sidecar (on the head "
        "node) bills them all, the rate and --disk-usd times N (default 1)",
    )
    p.add_argument("--once", action="store_true", help="poll once; exit 0 if budget.json was updated, else 1")
    p.add_argument("--timeout-s", type=float, default=20.0, help="total deadline of each HTTP request, seconds")
    return p


def make_source(args: argparse.Namespace, environ: Mapping[str, str]) -> ApiSource | ClockSource:
    if args.provider == CLOCK:
        if args.rate_usd_per_hr is None:
            raise X1Error("--provider clock needs --rate-usd-per-hr R (the instance's price in USD per hour)")
        return ClockSource(args.rate_usd_per_hr)
    api = APIS[args.provider]
    wrong = [a.id_flag for a in APIS.values() if a is not api and getattr(args, a.id_dest)]
    if wrong:
        raise X1Error(f"{wrong[0]} does not apply to --provider {args.provider}; use {api.id_flag}")
    key_env = args.api_key_env or api.key_env
    key = environ.get(key_env, "").strip()
    if not key:
        raise X1Error(
            f"environment variable {key_env} is not set: export {key_env}=<your {args.provider} API key>"
            f", or name another variable with --api-key-env, or use --provider clock --rate-usd-per-hr R"
        )
    base = args.provider_base_url or api.base_url
    return ApiSource(args.provider, base, key, key_env, args.timeout_s, getattr(args, api.id_dest))


def _check(args: argparse.Namespace) -> None:
    problems = []
    for flag, value in (
        ("--interval-min", args.interval_min),
        ("--timeout-s", args.timeout_s),
        ("--planned-hours", args.planned_hours),
        ("--rate-usd-per-hr", args.rate_usd_per_hr),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            problems.append(f"{flag} must be a positive number, got {value}")
    for flag, value in (("--disk-usd", args.disk_usd), ("--egress-usd", args.egress_usd)):
        if not (math.isfinite(value) and value >= 0):
            problems.append(f"{flag} must be a non-negative number, got {value}")
    if args.nodes < 1:
        problems.append(f"--nodes must be at least 1, got {args.nodes}")
    if not args.out.parent.is_dir():
        problems.append(f"--out {args.out}: directory {args.out.parent} does not exist; create it first")
    if problems:
        raise X1Error("; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        setup_logging(args.log_level, info_to="stderr")  # a background process: its lines on stderr
    except SystemExit as e:  # argparse has printed the usage error (or --help)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    stop = threading.Event()

    def body() -> int:
        _check(args)
        lines = FixedLines(disk_usd=args.disk_usd * args.nodes, egress_usd=args.egress_usd)
        ask = BudgetAsk(args.provider, args.planned_hours, lines, args.started_utc)
        source = make_source(args, os.environ)
        sidecar = Sidecar(
            source if args.nodes == 1 else NodesSource(source, args.nodes), args.out, ask, load_state(args.out)
        )
        sidecar._say(f"{args.provider}: writing {args.out} (state in {args.out}.state)")
        if args.once:
            return EXIT_OK if sidecar.poll() else EXIT_UNEXPECTED

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            return sidecar.run(args.interval_min * 60.0, stop)
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    with guarded_console():  # a closed terminal drops output, never the billing readings
        return guarded(body)


if __name__ == "__main__":
    raise SystemExit(main())
