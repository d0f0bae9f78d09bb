"""What every command-line entry point shares: user mistakes become one line and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .errors import EXIT_UNEXPECTED, X1Error


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
