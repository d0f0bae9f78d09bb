"""What every command-line entry point shares: user mistakes become one line and an exit code."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from .contract import EXIT_UNEXPECTED
from .errors import X1Error
from .log import ensure as ensure_logging

_log = logging.getLogger(__name__)


def guarded(body: Callable[[], int], os_errors: bool = False) -> int:
    """Run ``body``; an :class:`X1Error` is printed as ``error: ...`` (no traceback) and mapped to its exit
    code. With ``os_errors``, an ``OSError`` (a full disk, a permission) is printed the same way, exit 1."""
    try:
        return body()
    except X1Error as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if not os_errors:
            raise
        print(f"error: {e}", file=sys.stderr)
        return EXIT_UNEXPECTED


def old_spelling(group: Any, old: str, new: argparse.Action) -> None:
    """Accept ``old`` for one release as another spelling of the flag ``new``: the same destination and type,
    hidden from the help (the new flag's help names it), and a one-line notice on stderr when it is used."""
    takes_value = new.nargs != 0
    target = new.option_strings[0]

    class _Old(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: Any,
            option_string: str | None = None,
        ) -> None:
            ensure_logging()  # argparse runs before the command's own setup
            _log.warning(f"deprecated: {old} is now {target} (the old spelling works for one release)")
            setattr(namespace, self.dest, values if takes_value else new.const)

    group.add_argument(
        old,
        dest=new.dest,
        action=_Old,
        nargs=None if takes_value else 0,
        type=new.type,
        choices=new.choices,
        help=argparse.SUPPRESS,
        metavar=new.metavar,
        default=argparse.SUPPRESS,
    )
