"""Relaunch the trainer after preemption or a crash, never after a decision to stop.

    python -m x1_pretrain.watchdog [--max-restarts 20] [--backoff-s 5] -- python -m x1_pretrain.train ...

Relaunches on exit 75 (interrupted after a clean checkpoint), 1 (unexpected failure) or death by a
signal, adding ``--resume-from-latest`` when the command lacks it, after a backoff that doubles per
consecutive failure (capped at ``--max-backoff-s``). Never relaunches after 0 (finished), 2 (bad usage),
3 or 4 (budget stops), 5 (diverged), 6 (throughput floor) or 130 (aborted by a second Ctrl-C).
SIGTERM/SIGINT sent to the watchdog are forwarded to the trainer, which checkpoints and exits 75; the
watchdog then exits 75 without relaunching. Each restart is logged with its reason, exit code,
downtime, steps lost since the last checkpoint and relaunch latency (exit → new trainer's first step,
excluding that step, i.e. excluding compilation); the trainer records the restart count in MLflow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core.errors import EXIT_USAGE
from .training.watchdog import Watchdog


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m x1_pretrain.watchdog", description=__doc__,
                                 usage="python -m x1_pretrain.watchdog [options] -- <train command>",
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-restarts", type=int, default=20, help="relaunches before giving up (default 20)")
    ap.add_argument("--backoff-s", type=float, default=5.0, help="wait before a relaunch (doubles per crash)")
    ap.add_argument("--max-backoff-s", type=float, default=60.0, help="the longest wait (default 60)")
    ap.add_argument("--log-file", type=Path, default=None, help="append one JSON line per event here")
    return ap


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
    args = parser.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    if not cmd:
        print("error: no train command after --", file=sys.stderr)
        return EXIT_USAGE
    wd = Watchdog(cmd, args.max_restarts, args.backoff_s, args.max_backoff_s, args.log_file)
    try:
        return wd.run()
    finally:
        wd.status_file.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
