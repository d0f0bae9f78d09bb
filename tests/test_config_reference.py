"""docs/config.md lists every config key with its type, default and the meaning its field's comment gives in
``core/config.py``; this test keeps it in sync and checks that every key has a meaning.

After changing a key: ``.venv/bin/python -m tests.test_config_reference`` rewrites the file."""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
import typing
from pathlib import Path

from x1_pretrain.core import config as C

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "config.md"


def comments(cls: type) -> dict[str, str]:
    """{field: its comment}: the comment on the field's line and the comment-only lines under it."""
    out: dict[str, str] = {}
    current = None
    src = inspect.getsource(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    line_field: dict[int, str] = {}
    for i, line in enumerate(src.splitlines(), 1):
        head = line.strip().split(":", 1)[0]
        if head in names and line.startswith("    ") and not line.startswith("     "):
            line_field[i] = head
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        row = tok.start[0]
        if row in line_field:
            current = line_field[row]
        elif tok.type == tokenize.NAME and tok.start[1] == 4 and row not in line_field:
            current = None
        if tok.type == tokenize.COMMENT and current is not None:
            text = tok.string.lstrip("#").strip()
            out[current] = f"{out[current]} {text}" if current in out else text
    return out


def _type(tp: typing.Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Union and typing.Literal in {typing.get_origin(a) for a in typing.get_args(tp)}:
        return " \\| ".join(_type(a) for a in typing.get_args(tp))
    return f"`{str(tp).replace('typing.', '').replace('NoneType', 'None')}`".replace("<class '", "").replace("'>", "")


def render() -> str:
    parts = [
        "# Configuration reference\n",
        "Every key of a config file, by section: its type, its default and what it means. A config file sets "
        "any of them (`configs/x1-tiny-cpu.yaml`, `configs/x1-50m-a100.yaml`); `--set section.key=value` "
        "overrides one on the command line. An unknown key or a wrong type is exit 2 naming the key. "
        "(Generated from `src/x1_pretrain/core/config.py`: `.venv/bin/python -m tests.test_config_reference`.)\n",
    ]
    hints = {cls: typing.get_type_hints(cls) for cls in C.SECTIONS.values()}
    for section, cls in C.SECTIONS.items():
        parts.append(f"## {section}\n")
        parts.append("| key | type | default | meaning |")
        parts.append("|---|---|---|---|")
        notes = comments(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            meaning = notes.get(f.name, "").replace("|", "\\|")
            parts.append(f"| `{section}.{f.name}` | {_type(hints[cls][f.name])} | `{default!r}` | {meaning} |")
        parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def test_every_key_has_a_meaning():
    missing = [
        f"{s}.{f.name}" for s, cls in C.SECTIONS.items() for f in dataclasses.fields(cls) if f.name not in comments(cls)
    ]
    assert not missing, f"config keys without a comment in core/config.py: {missing}"


def test_the_reference_matches_the_code():
    assert REFERENCE.read_text() == render(), (
        "docs/config.md is stale: run .venv/bin/python -m tests.test_config_reference"
    )


if __name__ == "__main__":
    REFERENCE.write_text(render())
    print(f"wrote {REFERENCE}")
