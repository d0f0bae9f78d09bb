"""Relaunch the trainer after preemption or a crash, never after a decision to stop; keep the budget cap even when the
trainer cannot; end the bill when the run is over.

    python -m x1_pretrain.watchdog [--max-restarts 20] [--backoff-s 5] -- python -m x1_pretrain.train ...

Relaunches on the exits marked * below or death by a signal, adding ``--resume-from-latest`` when the command lacks
it, after a backoff that doubles per consecutive failure (capped at ``--max-backoff-s``); never after the others,
nor when two consecutive starts ended at the same step with no new checkpoint between them (a crash loop: it exits
with the trainer's code). SIGTERM/SIGINT/SIGHUP (a closed terminal) sent to the watchdog reach the trainer as
SIGTERM/SIGINT, which checkpoints and exits 75; the watchdog then exits without relaunching, and a trainer whose
watchdog is gone stops the same way (no orphan). Each restart is logged with its reason, exit code, downtime, steps
lost since the last checkpoint and relaunch latency (exit → new trainer's first step).

After exit 7 on a full checkpoint disk the watchdog waits (says so, alerts) until a checkpoint fits, then relaunches.

A closed terminal never loses the run: output that cannot be written goes to ``--log-file`` (else nowhere).
``--detach --log-file F``: the watchdog runs in the background in its own session, all output appended to F, and
prints the pid and how to follow and stop it: closing the terminal does nothing at all. An ending that leaves
nothing running (a crash loop, ``--max-restarts``, exit 0, 2, 5, 6, a stop by signal) alerts with the hourly rate.

Budget, second line: with a cap (``--budget-cap-usd`` and ``--budget-curr-cost-uri``, taken from the train command,
its flags or its config's ``budget.cap_usd``, unless given here) the watchdog reads the budget source and the
trainer's cost ledger itself every ``--budget-poll-s``; when the spend is above the cap it ends the trainer's
process group (SIGTERM, then SIGKILL after ``--budget-kill-grace-s``), alerts, and exits 4, even if the trainer is
stopped or hung.

``--terminate-on-exit lambda|runpod --export-to DIR``: after the trainer ends for good (exit 0, 3 or 4), or the
watchdog gives up (a crash loop, ``--max-restarts``: the run then ends at its last complete checkpoint), export the
run to DIR, upload it and the final checkpoint to ``--bundle-remote`` (default: the train command's
``--ckpt-remote``/bundle), read every size and sha256 back, and only then terminate the instance (the key in
LAMBDA_API_KEY / RUNPOD_API_KEY), logged and alerted. A failed export, upload or check (except after exit 4) leaves
the instance running and alerts what is missing and the rate; with no remote at all the flag is refused (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .budget import alerts
from .core import contract
from .core.console import guarded_console
from .core.contract import EXIT_USAGE, exit_code_help
from .core.errors import X1Error
from .core.log import add_flag as add_log_level
from .core.log import setup as setup_logging
from .core.names import default_mlflow_uri
from .launch.options import budget_of_command
from .supervise import options as O
from .supervise import terminate
from .supervise import watchdog as W


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m x1_pretrain.watchdog",
        description=__doc__,
        usage="python -m x1_pretrain.watchdog [options] -- <train command>",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=exit_code_help(True),
        allow_abbrev=False,
    )  # --detach is stripped by name before the relaunch
    add_log_level(ap)
    ap.add_argument("--max-restarts", type=int, default=20, help="relaunches before giving up (default 20)")
    ap.add_argument("--backoff-s", type=float, default=5.0, help="wait before a relaunch (doubles per crash)")
    ap.add_argument("--max-backoff-s", type=float, default=60.0, help="the longest wait (default 60)")
    ap.add_argument("--events-file", type=Path, help="append one JSON line per event (restarts, latency, the end)")
    ap.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="the text log: with --detach all output goes here; without, the output goes here from the "
        "moment the terminal closes (a FILE.jsonl is still taken as --events-file, deprecated)",
    )
    ap.add_argument(
        "--detach",
        action="store_true",
        help="run in the background in its own session, output appended to --log-file; prints the pid "
        "and how to follow and stop the run, so closing the terminal does nothing at all",
    )
    O.add_disk_flags(ap)
    b = ap.add_argument_group("budget, second line")
    b.add_argument(
        "--budget-cap-usd",
        type=float,
        help="default: the train command's (its --budget-cap-usd, else budget.cap_usd in its --config)",
    )
    b.add_argument("--budget-curr-cost-uri", help="default: the train command's --budget-curr-cost-uri")
    b.add_argument("--budget-poll-s", type=float, default=60.0, help="seconds between the watchdog's reads (60)")
    b.add_argument("--budget-kill-grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL, seconds (10)")
    terminate.add_flags(ap)
    return ap


def end_run(*args: Any) -> bool:
    """The trainer's way to end a run at its last checkpoint, loaded only when a crash-looped run needs it."""
    from .launch.session import end_at_last_checkpoint

    return end_at_last_checkpoint(*args)


def options(args: argparse.Namespace, cmd: list[str]) -> O.WatchdogOptions:
    train_cap, train_source = budget_of_command(cmd)
    cap = (
        args.budget_cap_usd
        if args.budget_cap_usd is not None
        else (train_cap if train_cap is not None else contract.flag_of(cmd, "--budget-cap-usd"))
    )  # another trainer: its flags
    source = args.budget_curr_cost_uri or train_source or contract.flag_of(cmd, "--budget-curr-cost-uri")
    line = None
    if cap is not None and source:
        try:
            line = O.BudgetLine(
                curr_cost_uri=source,
                cap_usd=float(cap),
                poll_s=args.budget_poll_s,
                kill_grace_s=args.budget_kill_grace_s,
            )
        except ValueError:
            raise X1Error(f"--budget-cap-usd {cap!r} is not a number") from None
        if line.poll_s <= 0 or line.kill_grace_s < 0:
            raise X1Error("--budget-poll-s must be positive and --budget-kill-grace-s >= 0")
    end = terminate.from_flags(
        args,
        contract.flag_of(cmd, "--ckpt-remote"),
        contract.flag_of(cmd, "--mlflow-uri") or default_mlflow_uri(contract.ckpt_dir_of(cmd)),
    )
    return O.WatchdogOptions(
        max_restarts=args.max_restarts,
        backoff_s=args.backoff_s,
        max_backoff_s=args.max_backoff_s,
        events_file=args.events_file,
        log_file=args.log_file,
        budget_line=line,
        end_of_bill=end,
        alerter=alerts.from_env(),
        mlflow_uri=contract.flag_of(cmd, "--mlflow-uri"),
        end_run=end_run,
        **O.disk_options(args),
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" not in argv:
        if {"-h", "--help"} & set(argv):
            parser.parse_args(argv)  # prints the help and exits 0
        parser.print_usage(sys.stderr)
        print("error: put the train command after --", file=sys.stderr)
        return EXIT_USAGE
    cut = argv.index("--")
    args, cmd = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    setup_logging(args.log_level, info_to="stderr")
    if not cmd:
        print("error: no train command after --", file=sys.stderr)
        return EXIT_USAGE
    args.events_file, args.log_file = O.old_log_file(args.events_file, args.log_file)  # deprecated spelling
    try:
        if args.detach and args.log_file is None:
            raise X1Error("--detach needs --log-file FILE: the run's output goes there")
        wd = W.Watchdog(cmd, options(args, cmd))
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if args.detach:
        return O.launch_detached(argv, args.log_file)
    with guarded_console(args.log_file):
        try:
            return wd.run()
        finally:
            wd.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
