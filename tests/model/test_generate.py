from __future__ import annotations

import pytest
import torch
from torch import nn

from x1_pretrain.core.config import ModelConfig
from x1_pretrain.model.generate import Sampling, generate
from x1_pretrain.sample import main

from ..ckpt_utils import SMALL_VOCAB, random_model, write_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample")
    model = random_model(SMALL_VOCAB)
    write_checkpoint(root / "ckpt", model)
    return root / "ckpt", model


def _gen(seed: int | None, model, **kw):
    g = None if seed is None else torch.Generator().manual_seed(seed)
    args = {"max_new_tokens": 12, "temperature": 1.0, "top_k": None, **kw}
    return generate(model, [1, 2, 3], Sampling(**args), generator=g)


def test_sampling_is_deterministic_with_a_seed(ckpt):
    _, model = ckpt
    assert _gen(5, model) == _gen(5, model)
    assert _gen(5, model) != _gen(6, model)
    assert len(_gen(5, model)) == 12


def test_greedy_equals_top_1_and_argmax(ckpt):
    _, model = ckpt
    greedy = _gen(None, model, temperature=0.0)
    assert greedy == _gen(1, model, top_k=1) == _gen(2, model, top_k=1, temperature=3.0)
    with torch.no_grad():
        assert greedy[0] == int(model(torch.tensor([[1, 2, 3]]))[0, -1].argmax())


def test_context_longer_than_seq_len_is_cropped(ckpt):
    _, model = ckpt
    long_prompt = list(range(3 * SMALL_VOCAB.seq_len))
    assert len(generate(model, long_prompt, Sampling(5))) == 5


class _Always(nn.Module):
    """Logits that always pick ``token`` (to test stopping)."""

    def __init__(self, token: int, vocab: int = 50) -> None:
        super().__init__()
        self.config = ModelConfig(seq_len=8, vocab_size=vocab)
        self.token, self.vocab = token, vocab
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, idx):
        out = torch.zeros(*idx.shape, self.vocab)
        out[..., self.token] = 10.0
        return out


def test_stops_at_eot_and_masks_undecodable_ids():
    assert generate(_Always(7), [1], Sampling(5, stop_id=7)) == []
    assert generate(_Always(7), [1], Sampling(3)) == [7, 7, 7]
    assert generate(_Always(45), [1], Sampling(2, allowed_vocab=40))[0] < 40


def test_cli_prints_prompt_and_continuation_deterministically(ckpt, capsys):
    ckpt_dir, _ = ckpt
    argv = [
        "--checkpoint",
        str(ckpt_dir),
        "--prompt",
        "The end of the",
        "--max-new-tokens",
        "6",
        "--seed",
        "3",
        "--ignore-eot",
        "--num-samples",
        "2",
        "--device",
        "cpu",
    ]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert main(argv) == 0
    second = capsys.readouterr()
    assert first.out == second.out
    samples = first.out.rstrip("\n").split("\n---\n")
    assert len(samples) == 2 and all(s.startswith("The end of the") for s in samples)
    assert "step 7" in first.err and "seed 3" in first.err


@pytest.mark.parametrize(
    "flag, value, match",
    [
        ("--temperature", "-1", "--temperature -1.0: must be >= 0"),
        ("--max-new-tokens", "0", "--max-new-tokens 0"),
        ("--prompt", "Zyzzyva quantum", "outside this model's vocabulary"),
    ],
)
def test_cli_bad_input_exits_2_with_the_flag_named(ckpt, capsys, flag, value, match):
    ckpt_dir, _ = ckpt
    assert main(["--checkpoint", str(ckpt_dir), flag, value]) == 2
    assert match in capsys.readouterr().err
