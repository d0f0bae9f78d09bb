"""Score a model on a list of tasks: the sets located (and fetched on first use), their items built, scored."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import registry, sets, tasks
from .score import Scorer, TaskScore, score


def load_items(
    names: list[str], limit: int | None, data_dir: Path | None = None, fetch: bool = True
) -> tuple[dict[str, list[tasks.Item]], dict[str, str]]:
    """({task: its first ``limit`` items}, {task: the sha256 of its file})."""
    out, hashes = {}, {}
    for name in registry.check_tasks(names):
        path = sets.locate(name, data_dir, fetch)
        out[name] = registry.items(name, sets.read_rows(path), limit)
        hashes[name] = registry.TASKS[name].sha256
    return out, hashes


def evaluate_model(
    model: Any,
    encode: Callable[[str], list[int]],
    names: list[str],
    limit: int | None,
    batch_size: int,
    bf16: bool,
    data_dir: Path | None = None,
) -> tuple[list[TaskScore], dict[str, str]]:
    items, hashes = load_items(names, limit, data_dir)
    scorer = Scorer(model, encode, batch_size, bf16)
    return [score(name, its, scorer) for name, its in items.items()], hashes
