from __future__ import annotations

import json

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import config as C
from x1_pretrain.core import safetensors_io
from x1_pretrain.data import hf_tokenizer
from x1_pretrain.export_hf import main
from x1_pretrain.model.generate import Sampling, generate

from ..ckpt_utils import SMALL_VOCAB, TINY_GPT2, random_model, write_checkpoint, write_config_yaml
from ..conftest import BPE_VOCAB, FAST, shared_path
from ..procs import SMALL_BATCH, train_cmd, train_here

TEXTS = [
    "Hello world",
    "¡Hola, mundo! ¿Cómo estás? naïve café",
    "emoji 😀🎉👩‍👩‍👧 and CJK 日本語のテキスト",
    "  leading, trailing  and\ttabs\n\n  new lines \n",
    "don't we'll they've 1234567 3.14 x=y+z;",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    model = random_model(TINY_GPT2)
    write_checkpoint(root / "ckpt", model, step=9)
    assert main(["--checkpoint", str(root / "ckpt"), "--output", str(root / "hf")]) == 0
    return root / "hf", model


def test_folder_contents(exported):
    out, _ = exported
    names = {p.name for p in out.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "x1_export.json",
        "x1_config.yaml",
        "README.md",
    }
    assert not list(out.parent.glob(".hf.tmp-*"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["torch_dtype"] == "float32" and cfg["rope_theta"] == 500.0
    assert cfg["tie_word_embeddings"] is True and cfg["eos_token_id"] == 50256
    assert safetensors_io.metadata(out / "model.safetensors") == {"format": "pt"}
    tensors = safetensors_io.load(out / "model.safetensors")
    assert "lm_head.weight" not in tensors and tensors["model.embed_tokens.weight"].dtype == torch.float32
    record = json.loads((out / "x1_export.json").read_text())
    assert record["step"] == 9 and record["tokenizer"].startswith("GPT-2 BPE")


def test_transformers_loads_llama_with_the_same_logits(exported):
    transformers = pytest.importorskip("transformers")
    out, model = exported
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.dtype == torch.float32
    idx = torch.randint(0, 50257, (2, TINY_GPT2.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx), atol=1e-5, rtol=1e-5)
    # generate() works and greedy decoding agrees with x1's own sampler
    prompt = [50256, 464, 3290]
    out_ids = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt) :].tolist()
    ours = generate(model, prompt, Sampling(8, stop_id=50256))
    assert out_ids[: len(ours)] == ours and len(ours) > 0


def test_autotokenizer_gives_tiktokens_ids(exported, tok):
    transformers = pytest.importorskip("transformers")
    out, _ = exported
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        ids = tok.encode(text)
        assert hf_tok(text)["input_ids"] == ids, text
        assert hf_tok.decode(ids) == text
    assert hf_tok.eos_token_id == 50256 and hf_tok.convert_tokens_to_ids("<|endoftext|>") == 50256


def test_autotokenizer_matches_golden_multilingual_ids(exported):
    transformers = pytest.importorskip("transformers")
    golden = json.loads(shared_path("tokenizer", "gpt2_hf_tik_testdata.json").read_text())
    hf_tok = transformers.AutoTokenizer.from_pretrained(exported[0])
    for sample in golden["samples"]:
        assert hf_tok(sample["text"])["input_ids"] == sample["ids"], sample["name"]


def test_existing_output_needs_overwrite(exported, tmp_path, capsys):
    out, _ = exported
    ckpt_dir = out.parent / "ckpt"
    target = tmp_path / "hf"
    target.mkdir()
    (target / "old.txt").write_text("old")
    assert main(["--checkpoint", str(ckpt_dir), "--output", str(target), "--no-tokenizer"]) == 2
    assert "--overwrite" in capsys.readouterr().err and (target / "old.txt").exists()
    assert main(["--checkpoint", str(ckpt_dir), "--output", str(target), "--no-tokenizer", "--overwrite"]) == 0
    assert not (target / "old.txt").exists() and (target / "model.safetensors").is_file()
    assert not (target / "vocab.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_missing_tokenizer_file_still_exports_the_model(exported, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("X1_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("X1_TOKENIZER_FILE", raising=False)
    ckpt_dir = exported[0].parent / "ckpt"
    code = main(
        [
            "--checkpoint",
            str(ckpt_dir),
            "--output",
            str(tmp_path / "hf"),
            "--tokenizer-file",
            str(tmp_path / "nope.tiktoken"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0 and "WITHOUT tokenizer files" in err and "tokenizer fetch" in err
    assert (tmp_path / "hf" / "model.safetensors").is_file() and not (tmp_path / "hf" / "vocab.json").exists()
    assert json.loads((tmp_path / "hf" / "x1_export.json").read_text())["tokenizer"].startswith("not written")


def test_final_safetensors_with_config_and_small_vocab(tmp_path, capsys):
    model = random_model(SMALL_VOCAB)
    write_checkpoint(tmp_path / "ckpt", model, final=True)
    lone = tmp_path / "final.safetensors"
    lone.write_bytes((tmp_path / "ckpt" / ck.FINAL_MODEL).read_bytes())
    assert main(["--checkpoint", str(lone), "--output", str(tmp_path / "hf")]) == 2
    assert "--config" in capsys.readouterr().err
    cfg = write_config_yaml(tmp_path / "c.yaml", SMALL_VOCAB)
    assert main(["--checkpoint", str(lone), "--config", str(cfg), "--output", str(tmp_path / "hf")]) == 0
    assert "not GPT-2's 50257" in capsys.readouterr().err
    tensors = safetensors_io.load(tmp_path / "hf" / "model.safetensors")
    torch.testing.assert_close(tensors["model.norm.weight"], model.model.norm.weight.detach())


@pytest.fixture(scope="module")
def own_tokenizer_export(bpe_data, tmp_path_factory):
    """A run on the trained-BPE data (stdlib code + prose), exported: the checkpoint dir holds the tokenizer."""
    root = tmp_path_factory.mktemp("own")
    ckpt = root / "ckpt"
    assert train_here(train_cmd(bpe_data, ckpt, 4, *FAST, *SMALL_BATCH, ckpt_every=4, eval_every=4)) == 0
    assert (ckpt / "tokenizer.json").read_bytes() == (bpe_data / "tokenizer.json").read_bytes()
    assert main(["--checkpoint", str(ckpt), "--output", str(root / "hf")]) == 0
    return root / "hf", ckpt


def test_the_data_tokenizer_travels_with_the_model(own_tokenizer_export, bpe_data):
    """AutoTokenizer and AutoModelForCausalLM load the export together, offline: encode, generate, decode."""
    transformers = pytest.importorskip("transformers")
    out, _ = own_tokenizer_export
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ours = hf_tokenizer.load_tokenizer_json(bpe_data / "tokenizer.json")
    text = "def f(x):\n    return x + 1  # naïve"
    ids = hf_tok(text)["input_ids"]
    assert ids == ours.encode(text) and hf_tok.decode(ids) == text
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == 0 == ours.eot_id
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == BPE_VOCAB and cfg["eos_token_id"] == cfg["bos_token_id"] == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    prompt = hf_tok("The", return_tensors="pt")
    gen = model.generate(**prompt, max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert gen.shape[1] == prompt["input_ids"].shape[1] + 5
    assert hf_tok.decode(gen[0]).startswith("The") and isinstance(hf_tok.decode(gen[0, 1:]), str)


def test_the_model_card_says_what_the_model_saw_and_how_to_make_it_again(own_tokenizer_export, bpe_data):
    out, ckpt = own_tokenizer_export
    card = (out / "README.md").read_text()
    state = json.loads((ckpt / "step_0000004" / "trainer_state.json").read_text())
    meta = json.loads((bpe_data / "meta.json").read_text())
    assert f"{state['tokens_seen']:,} tokens" in card and f"{state['last_val_loss']:.4f} nats" in card
    assert f"{state['last_val_bpb']:.4f} bits per byte" in card and meta["tokenizer_sha256"] in card
    for s in meta["sources"]:  # every source file with its share of the train tokens
        share = 100 * s["train_tokens"] / meta["splits"]["train"]["tokens"]
        assert f"| `{s['path']}` | {s['train_tokens']:,} | {share:.1f} % |" in card
    assert f"--train-tokenizer --vocab-size {BPE_VOCAB}" in card and "--config x1_config.yaml" in card
    assert "no budget guard" in card and "none were run" in card
    # the card's config is the run's resolved config
    resolved = C.load(out / "x1_config.yaml")
    assert resolved.to_dict() == state["config"]
