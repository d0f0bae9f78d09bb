"""Scoring: a model that prefers the gold ending scores 1.0, one that prefers the first ending scores the share
of gold-first items, a random init lands near chance, and the scores do not depend on the batch size."""

from __future__ import annotations

import math
import random

import pytest
import torch

from x1_pretrain.core import config as C
from x1_pretrain.data.tokenizer import load_gpt2
from x1_pretrain.evals import registry
from x1_pretrain.evals.score import Scorer, score
from x1_pretrain.model.transformer import Transformer

from ..conftest import TINY

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "lamp",
    "garden",
    "violin",
    "desert",
    "copper",
    "harbor",
    "house",
    "candle",
    "rocket",
    "pepper",
    "window",
]


@pytest.fixture(scope="module")
def encode():
    return load_gpt2().encode


def rows(n: int, seed: int = 0, split: bool = True) -> list[dict]:
    """HellaSwag-shaped rows: a short context and four one-word endings, the gold one at a random place. With
    ``split`` the gold word comes from the first half of WORDS and the three others from the second half; else
    all four from anywhere (the gold's place is then all that tells it apart)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gold = rng.randrange(4)
        if split:
            endings = rng.sample(WORDS[8:], 3)
            endings.insert(gold, rng.choice(WORDS[:8]))
        else:
            endings = rng.sample(WORDS, 4)
        out.append(
            {
                "activity_label": "Test",
                "ctx_a": f"Item {i} is about the",
                "ctx_b": "",
                "endings": endings,
                "label": str(gold),
            }
        )
    return out


class Prefers(torch.nn.Module):
    """A language model in x1's interface whose every prediction favours a fixed set of tokens."""

    def __init__(self, favoured: set[int], vocab: int = 50257) -> None:
        super().__init__()
        self.config = C.ModelConfig(vocab_size=vocab, seq_len=64, n_layer=1, d_model=8, n_head=2, n_kv_head=1, d_ff=8)
        head = torch.zeros(vocab, 2)
        head[sorted(favoured), 0] = 8.0
        self.lm_head = torch.nn.Linear(2, vocab, bias=False)
        self.lm_head.weight.data = head

    def hidden(
        self, idx: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        h = torch.zeros(*idx.shape, 2)
        h[..., 0] = 1.0
        return h


def test_a_model_that_prefers_the_gold_ending_scores_1(encode):
    data = rows(40)
    items = registry.items("hellaswag", data)
    # every word is one token after a space: a model favouring the gold words' tokens prefers exactly the gold
    assert all(len(encode(" " + w)) == 1 for w in WORDS)
    gold = Prefers({t for w in WORDS[:8] for t in encode(" " + w)})
    got = score("hellaswag", items, Scorer(gold, encode, batch_size=5))
    assert (got.acc, got.acc_norm, got.n, got.chance) == (1.0, 1.0, 40, 0.25)


def test_first_ending_preference_scores_the_share_of_gold_first_items(encode):
    data = [
        dict(r, endings=["apple", *r["endings"][1:]])
        for r in rows(60, seed=3, split=False)
        if "apple" not in r["endings"][1:]
    ]
    model = Prefers(set(encode(" apple")))
    got = score("hellaswag", registry.items("hellaswag", data), Scorer(model, encode, batch_size=16))
    share = sum(r["label"] == "0" for r in data) / len(data)
    assert 0 < share < 1 and got.acc == pytest.approx(share) and got.acc_norm == pytest.approx(share)


def tiny_model() -> Transformer:
    cfg = C.load(TINY, sets=["model.seq_len=64"])
    torch.manual_seed(0)
    return Transformer(cfg.model).eval()


def test_a_random_init_lands_near_chance_and_batch_size_changes_nothing(encode):
    model = tiny_model()
    data = rows(200, seed=5, split=False)
    items = registry.items("hellaswag", data)
    reqs = [r for it in items for r in it.requests]
    lls = {b: Scorer(model, encode, batch_size=b).logliks(reqs)[0] for b in (1, 7, 64)}
    for b in (7, 64):
        assert lls[b] == pytest.approx(lls[1], abs=1e-4)
    scores = {b: score("hellaswag", items, Scorer(model, encode, batch_size=b)) for b in (1, 64)}
    assert scores[1].acc == scores[64].acc and scores[1].acc_norm == scores[64].acc_norm
    assert abs(scores[1].acc - 0.25) < 0.12  # 200 items: chance +- 3.9 standard deviations


def test_a_context_longer_than_seq_len_is_cut_from_the_left_and_counted(encode):
    model = tiny_model()
    long = {"activity_label": "Long", "ctx_a": "word " * 200, "ctx_b": "", "endings": WORDS[:4], "label": "1"}
    got = score("hellaswag", registry.items("hellaswag", [long, rows(1)[0]]), Scorer(model, encode, batch_size=4))
    assert got.truncated == 4 and got.n == 2


def test_the_loglikelihood_is_the_sum_of_the_continuations_token_log_probabilities(encode):
    model = tiny_model()
    ctx, cont = "The cat sat on the", " mat today"
    (ll,), _ = Scorer(model, encode).logliks([(ctx, cont)])
    ids = encode(ctx + cont)
    n = len(encode(cont))
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).float(), dim=-1)[0]
    expected = sum(float(logp[p, ids[p + 1]]) for p in range(len(ids) - 1 - n, len(ids) - 1))
    assert ll == pytest.approx(expected, abs=1e-4)


def test_an_items_context_runs_once_and_gives_the_log_likelihoods_of_separate_rows(encode):
    model = tiny_model()
    assert model.config.n_kv_head < model.config.n_head  # the packed rows go through grouped-query attention
    data = rows(30, seed=7, split=False)
    data[3] = dict(data[3], ctx_a="word " * 70)  # too long to pack in 64 tokens: scored row by row
    items = registry.items("hellaswag", data)
    reqs = [r for it in items for r in it.requests]
    shared = Scorer(model, encode, batch_size=8)
    separate = Scorer(model, encode, batch_size=8, share_context=False)
    packed, _ = shared._rows(reqs)
    assert len(packed) == 29 + 4 and len(separate._rows(reqs)[0]) == 120
    (a, ta), (b, tb) = shared.logliks(reqs), separate.logliks(reqs)
    assert ta == tb == 4
    assert a == pytest.approx(b, abs=1e-4)
    assert score("hellaswag", items, shared).acc == score("hellaswag", items, separate).acc


def test_winogrande_contexts_differ_so_each_option_is_its_own_row(encode):
    row = {
        "sentence": "The trophy did not fit in the suitcase because _ was too big.",
        "option1": "the trophy",
        "option2": "the suitcase",
        "answer": "1",
    }
    scorer = Scorer(tiny_model(), encode)
    got, _ = scorer._rows(list(registry.items("winogrande", [row])[0].requests))
    assert [len(r.scored) for r in got] == [1, 1] and all(r.positions is None for r in got)


def test_an_item_whose_answer_alone_is_longer_than_seq_len_is_skipped_and_counted(encode):
    """The harness refuses such a request; cutting the answer would score another text. x1 leaves the item out of
    n (and out of chance) and counts it."""
    model = tiny_model()
    long = {"goal": "Pick one", "sol1": "a " * 80, "sol2": "b", "label": 1}
    got = score("piqa", registry.items("piqa", [long, *[dict(long, sol1="c")] * 3]), Scorer(model, encode))
    assert (got.n, got.skipped, got.chance) == (3, 1, 0.5) and got.to_json()["skipped"] == 1
    lls, truncated = Scorer(model, encode).logliks(registry.items("piqa", [long])[0].requests)
    assert math.isnan(lls[0]) and math.isfinite(lls[1]) and truncated == 0
