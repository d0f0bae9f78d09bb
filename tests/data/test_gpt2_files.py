from __future__ import annotations

import json

import pytest

from x1_pretrain.data.gpt2_files import bytes_to_unicode, tokenizer_files, vocab_and_merges

from ..conftest import shared_path


def test_bytes_to_unicode_is_gpt2s_printable_bijection():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


@pytest.fixture(scope="module")
def files(tok):
    return tokenizer_files(tok, 1024)


def test_vocab_and_merges_shape(tok):
    vocab, merges = vocab_and_merges(tok)
    assert len(vocab) == 50257 and len(merges) == 50000
    assert vocab["<|endoftext|>"] == 50256 and vocab["Ġthe"] == 262
    assert merges[0] == ("Ġ", "t")
    # every merge joins two tokens already in the vocabulary into one with a higher id
    for a, b in merges[:2000]:
        assert max(vocab[a], vocab[b]) < vocab[a + b]


def test_files_are_byte_identical_to_openais(files):
    encoder = json.loads(shared_path("tokenizer", "encoder.json").read_text())
    assert files["vocab.json"] == json.dumps(encoder)
    assert files["merges.txt"] == shared_path("tokenizer", "vocab.bpe").read_text(encoding="utf-8")


def test_tokenizer_config_says_gpt2_without_added_bos(files):
    cfg = json.loads(files["tokenizer_config.json"])
    assert cfg["tokenizer_class"] == "GPT2Tokenizer" and cfg["model_max_length"] == 1024
    assert cfg["add_bos_token"] is False and cfg["eos_token"] == "<|endoftext|>"
    assert json.loads(files["special_tokens_map.json"])["bos_token"] == "<|endoftext|>"
