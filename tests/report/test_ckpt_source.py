from __future__ import annotations

import shutil

import pytest
import torch

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core.config import ModelConfig
from x1_pretrain.core.errors import X1Error
from x1_pretrain.report.ckpt_source import load_model, resolve

from ..ckpt_utils import SMALL_VOCAB, random_model, write_checkpoint, write_config_yaml


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    write_checkpoint(root / "ckpt", random_model(SMALL_VOCAB, seed=1), step=3)
    model = random_model(SMALL_VOCAB, seed=2)
    write_checkpoint(root / "ckpt", model, step=5, final=True)
    return root / "ckpt", model


def _same_weights(a, b):
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb
        torch.testing.assert_close(va, vb, rtol=0, atol=0)


def test_checkpoint_dir_means_its_newest_complete_step(ckpt):
    ckpt_dir, model = ckpt
    src = resolve(ckpt_dir)
    assert src.weights == ckpt_dir / "step_0000005" / ck.MODEL_FILE and src.step == 5
    assert src.model == SMALL_VOCAB
    _same_weights(load_model(src), model)


def test_step_dir_and_its_model_file(ckpt):
    ckpt_dir, _ = ckpt
    assert resolve(ckpt_dir / "step_0000003").step == 3
    assert resolve(ckpt_dir / "step_0000003" / ck.MODEL_FILE).step == 3


def test_final_safetensors_takes_the_config_of_a_sibling_step_dir(ckpt):
    ckpt_dir, model = ckpt
    src = resolve(ckpt_dir / ck.FINAL_MODEL)
    assert src.weights == ckpt_dir / ck.FINAL_MODEL and src.model == SMALL_VOCAB
    _same_weights(load_model(src), model)


def test_lone_final_safetensors_needs_config(ckpt, tmp_path):
    ckpt_dir, model = ckpt
    shutil.copy(ckpt_dir / ck.FINAL_MODEL, tmp_path / ck.FINAL_MODEL)
    with pytest.raises(X1Error, match=r"no trainer_state\.json.*--config configs/"):
        resolve(tmp_path / ck.FINAL_MODEL)
    src = resolve(tmp_path / ck.FINAL_MODEL, write_config_yaml(tmp_path / "c.yaml", SMALL_VOCAB))
    _same_weights(load_model(src), model)


def test_wrong_config_is_named(ckpt, tmp_path):
    ckpt_dir, _ = ckpt
    cfg = write_config_yaml(
        tmp_path / "c.yaml",
        ModelConfig(n_layer=1, d_model=64, n_head=4, n_kv_head=2, d_ff=48, seq_len=16, vocab_size=1000),
    )
    with pytest.raises(X1Error, match=r"do not fit the model config from .*c\.yaml.*size mismatch"):
        load_model(resolve(ckpt_dir, cfg))


def test_incomplete_step_dir_is_refused(ckpt, tmp_path):
    ckpt_dir, _ = ckpt
    shutil.copytree(ckpt_dir / "step_0000003", tmp_path / "step_0000003")
    (tmp_path / "step_0000003" / ck.DONE_FILE).unlink()
    with pytest.raises(X1Error, match="not a complete checkpoint: no DONE marker"):
        resolve(tmp_path / "step_0000003")


@pytest.mark.parametrize(
    "name, match",
    [("missing", "no such file"), ("notes.txt", "must be a .safetensors"), ("empty", "no complete step_NNNNNNN")],
)
def test_bad_paths(tmp_path, name, match):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(X1Error, match=match):
        resolve(tmp_path / name)
