"""Each task's items as lm-evaluation-harness 0.4 builds them, zero-shot: the same prompt text, the same
clean-up, the same answer choices and the same target delimiter (one space), so a score here means what a
published harness score means.

* HellaSwag: ``"{activity_label}: {ctx_a} {ctx_b capitalised}"`` and the endings, both through the harness's
  clean-up of WikiHow artefacts (``[title]`` → ``. ``, other ``[...]`` dropped, double spaces single);
* ARC-Easy / ARC-Challenge: ``"Question: {question}\\nAnswer:"`` and the choice texts;
* PIQA: ``"Question: {goal}\\nAnswer:"`` and the two solutions;
* WinoGrande, partial scoring: one context per option (the sentence up to ``_`` with the option in its place)
  and one continuation shared by both (the rest of the sentence); only ``acc``, as the harness reports.

``acc`` picks the choice with the highest summed log-likelihood of its continuation; ``acc_norm`` divides each
by the length of the choice in characters, as the harness does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TARGET_DELIMITER = " "


@dataclass(frozen=True)
class Item:
    """One question: a (context, continuation) request per choice, the gold index, the choices' lengths."""

    requests: tuple[tuple[str, str], ...]
    gold: int
    choice_chars: tuple[int, ...]  # len(choice) per choice: acc_norm's denominators

    @property
    def n_choices(self) -> int:
        return len(self.requests)


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _choices_item(context: str, choices: list[str], gold: int) -> Item:
    return Item(tuple((context, TARGET_DELIMITER + c) for c in choices), gold, tuple(len(c) for c in choices))


def hellaswag(row: dict[str, Any]) -> Item:
    ctx = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return _choices_item(
        _hellaswag_clean(row["activity_label"] + ": " + ctx),
        [_hellaswag_clean(e) for e in row["endings"]],
        int(row["label"]),
    )


def arc(row: dict[str, Any]) -> Item:
    choices = row["choices"]
    return _choices_item(
        f"Question: {row['question']}\nAnswer:", list(choices["text"]), list(choices["label"]).index(row["answerKey"])
    )


def piqa(row: dict[str, Any]) -> Item:
    return _choices_item(f"Question: {row['goal']}\nAnswer:", [row["sol1"], row["sol2"]], int(row["label"]))


def winogrande(row: dict[str, Any]) -> Item:
    sentence = row["sentence"]
    blank = sentence.index("_")
    contexts = [sentence[:blank] + row["option1"], sentence[:blank] + row["option2"]]
    rest = TARGET_DELIMITER + sentence[blank + 1 :].strip()
    return Item(tuple((c, rest) for c in contexts), {"1": 0, "2": 1}[row["answer"]], tuple(len(c) for c in contexts))
