"""Each task's items are the harness's: the same prompt text, clean-up, choices, gold and delimiter."""

from __future__ import annotations

import pytest

from x1_pretrain.evals import registry, sets, tasks
from x1_pretrain.evals.score import encode_pair

HELLASWAG_ROW = {
    "activity_label": "Roof shingle removal",
    "ctx_a": "A man is sitting on a roof.",
    "ctx_b": "he",
    "endings": [
        "is using wrap to wrap a pair of skis.",
        "is ripping level tiles off.",
        "is holding a rubik's cube.",
        "starts pulling up roofing on a roof.",
    ],
    "label": "3",
}


def test_hellaswag_query_endings_and_the_wikihow_clean_up():
    item = tasks.hellaswag(HELLASWAG_ROW)
    assert item.requests[0] == (
        "Roof shingle removal: A man is sitting on a roof. He",
        " is using wrap to wrap a pair of skis.",
    )
    assert item.gold == 3 and item.choice_chars == tuple(len(e) for e in HELLASWAG_ROW["endings"])
    wiki = {
        "activity_label": "Home and Garden",
        "ctx_a": "[header] How to plant a tree [title] Dig a hole.",
        "ctx_b": "",
        "endings": ["[step] Water it  well.", "x", "y", "z"],
        "label": "0",
    }
    item = tasks.hellaswag(wiki)
    # the harness strips before it drops "[step]": the ending keeps a leading space, and so does x1
    assert item.requests[0] == ("Home and Garden: How to plant a tree. Dig a hole.", "  Water it well.")


def test_arc_and_piqa_ask_a_question_and_score_the_answers():
    arc = {
        "question": "Which is a gas?",
        "answerKey": "C",
        "choices": {"text": ["ice", "water", "steam"], "label": ["A", "B", "C"]},
    }
    item = tasks.arc(arc)
    assert item.requests == (
        ("Question: Which is a gas?\nAnswer:", " ice"),
        ("Question: Which is a gas?\nAnswer:", " water"),
        ("Question: Which is a gas?\nAnswer:", " steam"),
    )
    assert (
        item.gold == 2
        and tasks.arc({**arc, "answerKey": "1", "choices": {"text": ["a", "b"], "label": ["1", "2"]}}).gold == 0
    )
    item = tasks.piqa({"goal": "Open a jar", "sol1": "twist the lid", "sol2": "bite it", "label": 0})
    assert item.requests[1] == ("Question: Open a jar\nAnswer:", " bite it") and item.gold == 0


def test_winogrande_scores_the_rest_of_the_sentence_after_each_option():
    row = {
        "sentence": "Sarah was a much better surgeon than Maria so _ always got the easier cases.",
        "option1": "Sarah",
        "option2": "Maria",
        "answer": "2",
    }
    item = tasks.winogrande(row)
    assert item.requests == (
        ("Sarah was a much better surgeon than Maria so Sarah", " always got the easier cases."),
        ("Sarah was a much better surgeon than Maria so Maria", " always got the easier cases."),
    )
    assert item.gold == 1 and registry.TASKS["winogrande"].metrics == ("acc",)


def test_trailing_spaces_of_a_context_move_to_the_continuation():
    def encode(text: str) -> list[int]:
        return [ord(c) for c in text]

    assert encode_pair(encode, "Answer: ", "yes") == (encode("Answer:"), encode(" yes"))
    assert encode_pair(encode, "Answer:", " yes") == (encode("Answer:"), encode(" yes"))


def test_the_real_sets_when_they_are_cached():
    """The vendored files (hash-checked) hold what the harness reads: sizes, and HellaSwag's first query."""
    if not all((sets.cache_dir() / f"{t}.arrow").is_file() for t in registry.TASKS):
        pytest.skip("the eval sets are not cached (python -m x1_pretrain.evaluate --fetch)")
    for name, s in registry.TASKS.items():
        rows = sets.read_rows(sets.locate(name, fetch=False))
        assert len(rows) == s.items
        assert len(registry.items(name, rows, limit=7)) == 7
    first = registry.items("hellaswag", sets.read_rows(sets.locate("hellaswag", fetch=False)), limit=1)[0]
    assert first.requests[0][0] == "Roof shingle removal: A man is sitting on a roof. He" and first.gold == 3
