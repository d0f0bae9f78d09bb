"""Reading budget.json from a path, a ``file://`` URI or an ``http(s)://`` URL, with a total deadline (an
http(s) read sends ``$X1_BUDGET_TOKEN`` / ``$X1_BUDGET_TOKEN_FILE`` as a bearer token: ``budget_serve``).
Never raises: every fault is a :class:`~x1_pretrain.budget.guard.Reading` with the problem named (and the
URL's secrets masked)."""

from __future__ import annotations

import json
from pathlib import Path

from ..core import redact
from ..core.errors import X1Error
from ..core.http import HttpError, request
from .guard import Reading, parse
from .serve import TOKEN_ENV, TOKEN_FILE_ENV, token_from_env

DEADLINE_S = 10.0


def read_text(uri: str, deadline_s: float = DEADLINE_S) -> tuple[str | None, str | None]:
    """(text, None) or (None, problem) for a budget source."""
    shown = redact.url(uri)
    if uri.startswith(("http://", "https://")):
        try:  # the bearer token of a budget_serve (from the environment: never on a command line)
            token = token_from_env()
        except X1Error as e:
            return None, f"{shown} cannot be read: {e}"
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else None
            return request(uri, deadline_s, headers=headers).body.decode(), None
        except HttpError as e:
            hint = "" if token or e.status != 401 else f" (set {TOKEN_ENV} or {TOKEN_FILE_ENV})"
            return None, f"{shown} cannot be read ({redact.scrub(str(e), uri)}){hint}"
        except UnicodeDecodeError as e:
            return None, f"{shown} is not text ({e.reason})"
    path = Path(uri[len("file://") :]) if uri.startswith("file://") else Path(uri)
    try:
        return path.read_text(), None
    except FileNotFoundError:
        return None, f"{shown} does not exist (is the budget sidecar running?)"
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{shown} cannot be read ({type(e).__name__}: {e})"


def read_json(uri: str, deadline_s: float = DEADLINE_S) -> tuple[dict | None, str | None]:
    text, problem = read_text(uri, deadline_s)
    if text is None:
        return None, problem
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"{redact.url(uri)} is not valid JSON ({e.msg} at line {e.lineno})"
    return data if isinstance(data, dict) else None, None if isinstance(
        data, dict
    ) else f"{redact.url(uri)} is not a JSON object"


def read_source(uri: str, deadline_s: float = DEADLINE_S) -> Reading:
    """The budget reading at ``uri``."""
    data, problem = read_json(uri, deadline_s)
    if data is None:
        return Reading(None, problem)
    return parse(data)
