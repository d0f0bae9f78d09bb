"""docs/cli-reference.md holds every command's --help, as argparse prints it; this test keeps it in sync.

After changing a flag: ``.venv/bin/python -m tests.test_cli_reference`` rewrites the file."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "cli-reference.md"
COMMANDS = [
    "tokenizer",
    "tokenize_data",
    "plan",
    "budget_sidecar",
    "budget_serve",
    "train",
    "watchdog",
    "alerts",
    "export_run",
    "postmortem",
    "dod",
    "export_hf",
    "sample",
    "evaluate",
    "remote",
]
SUBCOMMANDS = {"tokenizer": ["fetch", "show"], "alerts": ["test"], "remote": ["push", "pull"]}


def help_text(command: str, *sub: str) -> str:
    """What ``python -m x1_pretrain.<command> [sub] --help`` prints, at a fixed width."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            importlib.import_module(f"x1_pretrain.{command}").main([*sub, "--help"])
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    # Python 3.10's argparse heads the flags "optional arguments:", later ones "options:"
    return out.getvalue().replace("\noptional arguments:\n", "\noptions:\n").rstrip() + "\n"


def render() -> str:
    parts = [
        "# Command-line reference\n",
        "Every flag of every command, as its `--help` prints it (generated: `.venv/bin/python -m "
        "tests.test_cli_reference`; `tests/test_cli_reference.py` fails when this page and the code differ).\n",
    ]
    parts += [f"- [`{c}`](#{c.replace('_', '')})" for c in COMMANDS]
    parts.append("")
    for c in COMMANDS:
        parts += [f"## {c}\n", "```text", help_text(c).rstrip(), "```", ""]
        for sub in SUBCOMMANDS.get(c, []):
            parts += [f"### {c} {sub}\n", "```text", help_text(c, sub).rstrip(), "```", ""]
    return "\n".join(parts)


def test_the_reference_lists_every_flag_of_every_command():
    top = sorted(p.stem for p in (REPO / "src" / "x1_pretrain").glob("*.py") if p.stem != "__init__")
    assert sorted(COMMANDS) == top, "a command is missing from the reference"
    assert REFERENCE.read_text() == render(), (
        "docs/cli-reference.md is out of date: run .venv/bin/python -m tests.test_cli_reference"
    )


if __name__ == "__main__":
    REFERENCE.write_text(render())
    print(f"wrote {REFERENCE}")
