from __future__ import annotations

import json

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core import safetensors_io
from x1_pretrain.export_hf import main
from x1_pretrain.model.generate import Sampling, generate

from ..ckpt_utils import SMALL_VOCAB, TINY_GPT2, random_model, write_checkpoint, write_config_yaml
from ..conftest import shared_path

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
