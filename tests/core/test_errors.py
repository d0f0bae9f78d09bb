"""The exit-code table exists once (core/contract.py); the README, `train --help` and the watchdog follow it."""

from __future__ import annotations

import re

from x1_pretrain.core.contract import EXIT_CODES
from x1_pretrain.launch.options import build_parser
from x1_pretrain.supervise import watchdog as W

from ..conftest import REPO


def test_the_readme_table_is_the_code_table():
    text = (REPO / "README.md").read_text()
    table = text[text.index("| code | meaning | watchdog |") :]
    rows = re.findall(r"^\| (\d+) \| (.+?) \| (relaunches|stops) \|$", table.split("\n\n")[0], re.M)
    assert [(int(c), m.replace("`", ""), w == "relaunches") for c, m, w in rows] == [
        (e.code, e.meaning, e.relaunched) for e in EXIT_CODES
    ]


def test_train_help_and_the_watchdog_policy_come_from_it():
    help_text = " ".join(build_parser().format_help().split())
    for e in EXIT_CODES:
        assert f"{e.code}{'*' if e.relaunched else ''} {' '.join(e.meaning.split())}" in help_text, e.code
        assert W.should_relaunch(e.code) == e.relaunched, e.code
        assert W.describe_exit(e.code) == e.short
    watchdog_help = " ".join(__import__("x1_pretrain.watchdog", fromlist=["x"]).build_parser().format_help().split())
    assert all(f"{e.code}{'*' if e.relaunched else ''} {e.short}" in watchdog_help for e in EXIT_CODES)
