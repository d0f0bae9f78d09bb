"""The README stays a newcomer's first page, and no link in the docs points nowhere."""

from __future__ import annotations

import re
import subprocess

from .conftest import REPO

PAGES = [REPO / "README.md", REPO / "DEVELOPERS.md", *sorted((REPO / "docs").glob("*.md"))]


def test_the_readme_is_short_and_says_where_to_look_next():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for must in (
        "make demo",
        "make test",
        "python -m x1_pretrain.tokenize_data",
        "python -m x1_pretrain.budget_sidecar",
        "--dry-run-budget",
        "python -m x1_pretrain.watchdog",
        "## Exit codes",
        "## Where to look next",
    ):
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


def _anchors(page) -> set[str]:
    """The heading anchors of a page, as GitHub makes them (lower case, punctuation dropped, spaces to -)."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_no_doc_sends_users_to_the_developers_shared_folder():
    """``../shared`` exists only beside the developers' checkout: what users need of it (the errata) is in docs/."""
    tracked = [
        REPO / p
        for p in subprocess.run(
            ["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    ]
    pages = sorted({*PAGES, *tracked})
    assert REPO / "docs" / "errata.md" in pages
    offending = [
        f"{p.relative_to(REPO)}:{i}"
        for p in pages
        if p.is_file()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "../shared" in line
    ]
    assert not offending, offending
    assert "](docs/errata.md" in (REPO / "README.md").read_text()


def test_errata_references_link_to_a_section_that_exists():
    anchors = _anchors(REPO / "docs" / "errata.md")
    assert {"1-throughput", "2-cost", "5-the-chinchilla-estimate"} <= anchors
    bad = []
    for page in PAGES:
        text = page.read_text()
        bad += [f"{page.relative_to(REPO)}: #{a}" for a in re.findall(r"errata\.md#([\w-]+)", text) if a not in anchors]
        bad += [f"{page.relative_to(REPO)}: bare '{m}'" for m in re.findall(r"ERRATA(?: \d)?", text)]
    assert not bad, bad
