"""The user's own tokenizer: a tokenizer.json, a BPE trained on the input, uint32 bins for a large vocabulary,
the model taking the data's vocab, and a resume on data of another tokenizer refused."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as HF

from x1_pretrain import tokenize_data
from x1_pretrain.core import config as C
from x1_pretrain.core.errors import DataError
from x1_pretrain.data import hf_tokenizer
from x1_pretrain.data.demo_corpus import demo_documents, write_demo_corpus
from x1_pretrain.data.tokens import open_token_data, scan_max_id

from ..conftest import BPE_VOCAB, FAST, TINY
from ..procs import SMALL_BATCH, train_cmd, train_here


def documents(ids: np.ndarray, eot: int) -> list[list[int]]:
    """The bins cut at each end-of-text id (every document ends with one)."""
    cuts = np.flatnonzero(ids == eot)
    out, start = [], 0
    for c in cuts:
        out.append(ids[start:c].tolist())
        start = c + 1
    assert start == ids.size, "the bins end with a document's end-of-text"
    return out


def test_trained_bpe_is_deterministic_invariant_to_workers_and_round_trips(bpe_data, tmp_path):
    meta = json.loads((bpe_data / "meta.json").read_text())
    text = (bpe_data / "tokenizer.json").read_text()
    assert meta["tokenizer"] == "tokenizers" and meta["vocab_size"] == BPE_VOCAB and meta["dtype"] == "uint16"
    assert meta["eot_id"] == 0 and meta["eot_token"] == "<|endoftext|>"
    assert meta["tokenizer_sha256"] == meta["tokenizer_json_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    # the same input trains the same tokenizer, and two workers write the same bins
    raw = bpe_data.parent / "raw"
    again = tmp_path / "again"
    args = ["--input-dir", str(raw), "--output-dir", str(again), "--val-fraction", "0.1", "--workers", "2"]
    code = tokenize_data.main([*args, "--train-tokenizer", "--vocab-size", str(BPE_VOCAB)])
    assert code == 0
    for name in ("tokenizer.json", "train.bin", "val.bin", "unigram_counts.npy"):
        assert (again / name).read_bytes() == (bpe_data / name).read_bytes(), name
    # the bins decode, document by document, to the input's text (through tokenizers itself, not x1's fast path)
    hf = HF.from_file(str(bpe_data / "tokenizer.json"))
    train = np.fromfile(bpe_data / "train.bin", dtype=np.uint16)
    val = np.fromfile(bpe_data / "val.bin", dtype=np.uint16)
    decoded = [hf.decode(d) for split in (train, val) for d in documents(split, 0)]
    code_docs = [(raw / "code" / f).read_text() for f in sorted(p.name for p in (raw / "code").iterdir())]
    assert sorted(decoded) == sorted(code_docs + demo_documents())
    # x1's encoder (tiktoken's fast path where the ids follow the merges) gives tokenizers' ids
    tok = hf_tokenizer.load_tokenizer_json(bpe_data / "tokenizer.json")
    assert tok.fast is not None
    for doc in code_docs[:3] + demo_documents()[:5]:
        assert tok.encode(doc) == hf.encode(doc, add_special_tokens=False).ids
    # bits per byte's denominator: the bytes of the ids are the bytes of the text
    table = tok.token_bytes()
    assert table[0] == 0 and int(table[train].sum() + table[val].sum()) == sum(len(d.encode("utf-8")) for d in decoded)
    # the code source is in the vocabulary: Python's keywords are single tokens
    assert len(tok.encode(" def")) == 1 and len(tok.encode(" return")) == 1 and len(tok.encode(" self")) == 1


def test_gpt2_output_carries_its_tokenizer_json(demo_data, tok):
    """The default output is GPT-2's (uint16, end of text 50256) and its tokenizer.json gives tiktoken's ids."""
    meta = json.loads((demo_data / "meta.json").read_text())
    assert meta["tokenizer"] == "gpt2" and meta["dtype"] == "uint16" and meta["eot_id"] == 50256
    hf = HF.from_file(str(demo_data / "tokenizer.json"))
    assert hf.get_vocab_size() == 50257
    docs = documents(np.fromfile(demo_data / "train.bin", dtype=np.uint16), 50256)
    for d in docs[:4]:
        text = tok.decode(d)
        assert hf.encode(text, add_special_tokens=False).ids == d == tok.encode(text)


def big_tokenizer(small: Path, dest: Path, shift: int = 66_000) -> Path:
    """``small``'s BPE with every id moved up by ``shift`` and unreachable filler entries below: a tokenizer of
    more than 65,535 ids whose real ids are all above uint16's range."""
    spec = json.loads(small.read_text())
    vocab = {piece: i + shift for piece, i in spec["model"]["vocab"].items()}
    vocab.update({f"<filler {i}>": i for i in range(shift)})
    spec["model"]["vocab"] = vocab
    for t in spec["added_tokens"]:
        t["id"] += shift
    dest.write_text(json.dumps(spec))
    return dest


def test_a_vocab_over_65535_gives_uint32_bins_that_decode_to_the_text(bpe_data, tmp_path):
    big = big_tokenizer(bpe_data / "tokenizer.json", tmp_path / "big.json")
    write_demo_corpus(tmp_path / "raw")
    out = tmp_path / "tok"
    args = ["--input-dir", str(tmp_path / "raw"), "--output-dir", str(out), "--val-fraction", "0.1"]
    code = tokenize_data.main([*args, "--workers", "2", "--tokenizer", str(big)])
    assert code == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 66_000 + BPE_VOCAB and meta["eot_id"] == 66_000
    train = np.fromfile(out / "train.bin", dtype=np.uint32)
    assert (out / "train.bin").stat().st_size == 4 * meta["splits"]["train"]["tokens"] == 4 * train.size
    assert train.min() >= 66_000  # every id is above uint16's range
    val = np.fromfile(out / "val.bin", dtype=np.uint32)
    hf = HF.from_file(str(big))
    docs = [d for split in (train, val) for d in documents(split, 66_000)]
    assert sorted(hf.decode(d) for d in docs) == sorted(demo_documents())
    # the same text, the same pieces: the ids are the small tokenizer's, moved up
    small = hf_tokenizer.load_tokenizer_json(bpe_data / "tokenizer.json")
    assert [i - 66_000 for i in docs[0]] == small.encode(hf.decode(docs[0]))
    # the reader maps uint32 bins; an id past the vocab names the file and its byte offset
    data = open_token_data(out, meta["vocab_size"], 32)
    assert data.train.dtype == np.uint32 and int(data.train[5]) == int(train[5])
    bad = train.copy()
    bad[7] = 70_000
    with pytest.raises(DataError, match=r"token id 70000 at token offset 7 \(byte 28\)"):
        scan_max_id(bad, out / "train.bin", 68_000)


def test_the_model_takes_the_data_vocab_and_refuses_another_tokenizer_at_resume(bpe_data, demo_data, tmp_path):
    assert C.load(TINY).model.vocab_size == 50257  # auto without data: tokenize_data's default, GPT-2
    assert C.load(TINY, vocab=C.data_vocab(bpe_data)).model.vocab_size == BPE_VOCAB
    ckpt = tmp_path / "ckpt"
    assert train_here(train_cmd(bpe_data, ckpt, 2, *FAST, *SMALL_BATCH, ckpt_every=2, eval_every=2)) == 0
    state = json.loads((ckpt / "step_0000002" / "trainer_state.json").read_text())
    assert state["config"]["model"]["vocab_size"] == BPE_VOCAB
    meta = json.loads((bpe_data / "meta.json").read_text())
    assert state["tokenizer_sha256"] == meta["tokenizer_sha256"]
    # a resume on GPT-2 data: exit 2 naming both tokenizers' hashes, nothing written
    before = sorted(p.name for p in ckpt.iterdir())
    gpt2 = json.loads((demo_data / "meta.json").read_text())["tokenizer_sha256"]
    cmd = train_cmd(demo_data, ckpt, 4, *FAST, *SMALL_BATCH, "--resume-from-latest", seed=False)
    assert train_here(cmd) == 2
    assert sorted(p.name for p in ckpt.iterdir()) == before
    assert gpt2 is not None and meta["tokenizer_sha256"] != gpt2


def test_resume_refusal_names_both_hashes(bpe_data, demo_data, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert train_here(train_cmd(bpe_data, ckpt, 1, *FAST, *SMALL_BATCH, ckpt_every=1)) == 0
    capsys.readouterr()
    assert train_here(train_cmd(demo_data, ckpt, 2, *FAST, *SMALL_BATCH, "--resume-from-latest", seed=False)) == 2
    err = capsys.readouterr().err
    mine = json.loads((bpe_data / "meta.json").read_text())["tokenizer_sha256"]
    assert mine in err and "306cd27f03c1a714" in err and "cannot resume" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vocab-size", "300"], "add --train-tokenizer"),
        (["--train-tokenizer"], "--train-tokenizer needs --vocab-size"),
        (["--tokenizer", "missing.json"], "no such file"),
        (["--train-tokenizer", "--vocab-size", "100"], "at least 257"),
        (["--eot-token", "</s>"], "GPT-2's end-of-text token"),
    ],
)
def test_tokenizer_flags_that_do_not_go_together_are_exit_2(tmp_path, capsys, args, message):
    write_demo_corpus(tmp_path / "raw")
    code = tokenize_data.main(["--input-dir", str(tmp_path / "raw"), "--output-dir", str(tmp_path / "o"), *args])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o" / "meta.json").exists()


def test_a_tokenizer_file_without_the_separator_or_not_json_is_named(bpe_data, tmp_path, capsys):
    write_demo_corpus(tmp_path / "raw")
    base = ["--input-dir", str(tmp_path / "raw"), "--output-dir", str(tmp_path / "o")]
    shutil.copy(bpe_data / "tokenizer.json", tmp_path / "t.json")
    assert tokenize_data.main([*base, "--tokenizer", str(tmp_path / "t.json"), "--eot-token", "</s>"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "t.json") in err and "'</s>'" in err and "--eot-token" in err
    (tmp_path / "bad.json").write_text('{"model": ')
    assert tokenize_data.main([*base, "--tokenizer", str(tmp_path / "bad.json")]) == 2
    assert "not a Hugging Face tokenizers file" in capsys.readouterr().err
    assert not (tmp_path / "o" / "meta.json").exists()


def test_a_replaced_tokenizer_json_is_named(bpe_data, tmp_path):
    d = tmp_path / "d"
    shutil.copytree(bpe_data, d)
    (d / "tokenizer.json").write_text((d / "tokenizer.json").read_text() + " ")
    meta = json.loads((d / "meta.json").read_text())
    with pytest.raises(DataError, match=r"tokenizer\.json: sha256 .* is not the .* its meta\.json records"):
        hf_tokenizer.of_data(d, meta)
