"""An evaluation's size before it runs: the tokens each task's items put through the model (as the scorer
builds its rows, contexts shared) and its estimated time in training steps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from x1_pretrain.core.errors import X1Error
from x1_pretrain.data.tokenizer import load_gpt2
from x1_pretrain.evals import cost, registry, sets
from x1_pretrain.evals.score import Scorer


class Shape:
    """Only what the scorer reads to build its rows: the lab's seq_len and the vocabulary."""

    config = SimpleNamespace(seq_len=1024, vocab_size=50257)

    def hidden(self, idx, positions=None, mask=None):
        raise AssertionError("not run")


def test_the_tokens_per_item_table_is_what_the_scorer_builds_on_the_real_sets():
    if not all((sets.cache_dir() / f"{t}.arrow").is_file() for t in registry.TASKS):
        pytest.skip("the eval sets are not cached (python -m x1_pretrain.evaluate --fetch)")
    scorer = Scorer(Shape(), load_gpt2().encode)
    for name, s in registry.TASKS.items():
        items = registry.items(name, sets.read_rows(sets.locate(name, fetch=False)))
        rows, _ = scorer._rows([r for it in items for r in it.requests])
        assert sum(len(r.tokens) for r in rows) / len(items) == pytest.approx(s.tokens_per_item, abs=0.05), name


def test_the_size_follows_the_limit_and_stops_at_the_set():
    one = cost.eval_tokens(["arc_easy"], 100)
    assert cost.eval_tokens(["arc_easy"], 200) == pytest.approx(2 * one)
    assert cost.eval_tokens(["arc_easy"], 10**6) == cost.eval_tokens(["arc_easy"], None) == pytest.approx(570 * 41.2)
    assert cost.eval_tokens(["arc_easy", "piqa"], 100) == pytest.approx(one + 100 * 57.3)
    # forward only (a third of a training token's FLOPs) at half the training speed: 2/3 of a step per step's tokens
    assert cost.eval_in_steps(["arc_easy"], 100, int(one)) == pytest.approx(2 / 3, rel=1e-3)
    with pytest.raises(X1Error, match="unknown task 'mmlu'"):
        cost.eval_tokens(["mmlu"], None)
