"""Secrets never leave the process: URLs are shown without userinfo, query values or fragments.

``http://user:token@host/budget.json?token=abc`` is shown as ``http://***@host/budget.json?token=***``.
Every place that prints, alerts, tags, checkpoints or exports a URL passes it through :func:`url`.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"


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
    found = [parts.netloc.rpartition("@")[0] if "@" in parts.netloc else "", parts.password or "", parts.fragment,
             parts.query, *(v for _, v in parse_qsl(parts.query, keep_blank_values=True))]
    return sorted({s for s in found if len(s) >= 3}, key=len, reverse=True)


def scrub(text: str, *urls: str | None) -> str:
    """Free text with every secret of the given URLs replaced by ``***``."""
    for u in urls:
        for s in secrets_of(u):
            text = text.replace(s, MASK)
    return text
