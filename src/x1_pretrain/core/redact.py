"""Secrets never leave the process: URLs are shown without userinfo, query values or fragments.

``http://user:token@host/budget.json?token=abc`` is shown as ``http://***@host/budget.json?token=***``.
Every place that prints, alerts, tags, checkpoints or exports a URL passes it through :func:`url`.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl, urlsplit, urlunsplit

_log = logging.getLogger(__name__)

MASK = "***"
# Where credentials go instead of a URL flag (a command line is visible to every local user in ps).
MLFLOW_CREDENTIALS = (
    "put the user and password in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or a "
    "token in MLFLOW_TRACKING_TOKEN), which MLflow reads, and give the URL without them"
)
BUDGET_CREDENTIALS = (
    "put the token in X1_BUDGET_TOKEN or a file named by X1_BUDGET_TOKEN_FILE (sent as a bearer "
    "token) and give the URL without it"
)
_warned: set[str] = set()


def url(text: str | None) -> str | None:
    """``text`` with the secret parts of a URL masked; paths and plain strings come back unchanged."""
    if not text or "://" not in text:
        return text
    try:
        parts = urlsplit(text)
    except ValueError:
        return MASK
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return text  # nothing secret (and sqlite:////abs/path keeps its four slashes)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    query = "&".join(f"{k}={MASK}" for k, _ in parse_qsl(parts.query, keep_blank_values=True)) if parts.query else ""
    if parts.query and not query:
        query = MASK
    return urlunsplit((parts.scheme, netloc, parts.path, query, MASK if parts.fragment else ""))


def secrets_of(text: str | None) -> list[str]:
    """The secret parts of a URL (userinfo, password, query values, fragment), longest first, for scrubbing
    free text such as exception messages."""
    if not text or "://" not in text:
        return []
    try:
        parts = urlsplit(text)
    except ValueError:
        return [text]
    found = [
        parts.netloc.rpartition("@")[0] if "@" in parts.netloc else "",
        parts.password or "",
        parts.fragment,
        parts.query,
        *(v for _, v in parse_qsl(parts.query, keep_blank_values=True)),
    ]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, *urls: str | None) -> str:
    """Free text with every secret of the given URLs replaced by ``***``."""
    for u in urls:
        for s in secrets_of(u):
            text = text.replace(s, MASK)
    return text


def warn_if_visible(flag: str, value: str | None, instead: str) -> bool:
    """Once a process and flag: a warning that ``value`` (a URL flag's) carries a secret (userinfo, a query or a
    fragment) that every local user can read in ``ps``, and where it should go instead. True when warned."""
    if flag in _warned or not secrets_of(value):
        return False
    _warned.add(flag)
    _log.warning(
        f"{flag} {url(value)} carries a secret, and a command line is visible to every user of this "
        f"machine (ps): {instead}"
    )
    return True
