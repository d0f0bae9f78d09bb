"""Pretrain the model: ``python -m x1_pretrain.train --config configs/x1-50m-a100.yaml --data-dir ...``

Exit codes: ``core.contract.EXIT_CODES``, printed by ``--help`` with every flag. A closed terminal stops the run
like SIGTERM (checkpoint, exit 75); output that can no longer reach it is dropped.
"""

from __future__ import annotations

import os
import sys

from .core.console import guarded_console
from .core.contract import record_exit_status
from .core.log import setup as setup_logging
from .launch.options import build_parser, options_from
from .launch.session import main_guarded


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level)
    opts = options_from(args)
    with guarded_console():  # a closed terminal drops output (or sends it to $X1_LOG_FILE), never the run
        code, reason = main_guarded(opts)
    first_of_node = os.environ.get("LOCAL_RANK", "0") == "0"  # rank 0, or another machine's first process
    if first_of_node and not opts.dry_run_budget:
        try:  # for the watchdog: torchrun reports any failed worker as 1 (rank 0's code reaches every node)
            record_exit_status(opts.ckpt_dir if os.environ.get("RANK", "0") == "0" else None, code, reason)
        except KeyboardInterrupt:  # a second Ctrl-C after the run already ended: its code stands
            print(f"interrupted while recording exit {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
