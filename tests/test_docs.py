"""The README stays a newcomer's first page, and no link in the docs points nowhere."""

from __future__ import annotations

import re

from .conftest import REPO

PAGES = [REPO / "README.md", REPO / "DEVELOPERS.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readme_is_short_and_says_where_to_look_next():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for must in ("make demo", "make test", "python -m x1_pretrain.tokenize_data",
                 "python -m x1_pretrain.budget_sidecar", "--dry-run-budget", "python -m x1_pretrain.watchdog",
                 "## Exit codes", "## Where to look next"):
        assert must in text, must


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken
