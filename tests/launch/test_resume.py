"""Resuming across x1 versions and switches: keys x1 gained since a checkpoint, and optimizer state that no
longer fits the model's tensors (vocabulary padding, fused projections) refused before the first step."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from x1_pretrain.core import config as C
from x1_pretrain.core.errors import X1Error
from x1_pretrain.launch.resume import _check_optimizer_shapes, check_compatible
from x1_pretrain.model.transformer import Transformer

from ..conftest import TINY


def old_checkpoint(cfg: C.Config) -> SimpleNamespace:
    """A checkpoint written before x1 had the GPU-path keys: its saved config lacks them."""
    saved = cfg.to_dict()
    for key in ("vocab_pad_multiple", "fused_projections"):
        saved["model"].pop(key)
    for key in ("fused_loss", "loss_chunk_tokens", "bf16_residual", "compile_scope", "deterministic"):
        saved["train"].pop(key)
    return SimpleNamespace(state={"config": saved, "data_identity": "d"}, path=Path("step_0000100"))


def test_keys_added_since_a_checkpoint_are_no_change_unless_their_absence_meant_another_value():
    cfg = C.load(TINY)
    data = SimpleNamespace(identity="d", directory=Path("data"))
    logs: list[str] = []
    with pytest.raises(X1Error, match=r"model\.vocab_pad_multiple: 1 -> 128"):  # written unpadded
        check_compatible(old_checkpoint(cfg), cfg, data, allow=False, log=logs.append)
    unpadded = C.load(TINY, sets=["model.vocab_pad_multiple=1"])
    assert check_compatible(old_checkpoint(unpadded), unpadded, data, allow=False, log=logs.append) == []
    assert logs == []  # the other new keys sit at defaults that mean what the old run did: nothing to say
    fused = C.load(TINY, sets=["model.vocab_pad_multiple=1", "model.fused_projections=true"])
    with pytest.raises(X1Error, match=r"model\.fused_projections: False -> True"):
        check_compatible(old_checkpoint(unpadded), fused, data, allow=False, log=logs.append)


def test_optimizer_state_of_another_layout_is_refused_with_the_fix():
    """Padded and unpadded models have the same parameters in the same order, only the embedding's rows differ:
    torch loads the moments without a word and AdamW would crash at the first step. Fused projections change the
    number of parameters, which torch refuses itself (restore turns that into an X1Error too)."""
    cfg = C.load(TINY)
    models = [Transformer(cfg.model), Transformer(dataclasses.replace(cfg.model, vocab_pad_multiple=1))]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    idx = torch.randint(0, cfg.model.vocab_size, (2, 16))
    models[0](idx, idx).backward()
    opts[0].step()
    models[1].load_state_dict(models[0].state_dict())  # the weights load: both save 50,257 rows
    opts[1].load_state_dict(opts[0].state_dict())  # and so does the optimizer state, silently
    with pytest.raises(
        X1Error,
        match=r"\(50304, 64\) where this model's parameter has \(50257, 64\).*"
        r"model\.vocab_pad_multiple=1",
    ):
        _check_optimizer_shapes(opts[1], "ckpt/step_0000001")
    _check_optimizer_shapes(opts[0], "ckpt/step_0000001")  # the run's own state fits
    fused = Transformer(dataclasses.replace(cfg.model, fused_projections=True))
    with pytest.raises(ValueError):
        torch.optim.AdamW(fused.parameters(), lr=1e-3).load_state_dict(opts[0].state_dict())


def test_another_micro_batch_or_rank_count_resumes_but_another_global_batch_or_seed_is_refused():
    """A checkpoint whose config holds a per-rank accumulation (written by 2 ranks before it was derived over all
    ranks) or another micro-batch resumes with a note; batch_size or seed, which decide the data order, do not."""
    cfg = C.load(TINY)
    data = SimpleNamespace(identity="d", directory=Path("data"))
    saved = cfg.to_dict()
    saved["train"].update(micro_batch_size=4, grad_accum_steps=2)  # 2 ranks x 2 micro-steps x 4 sequences
    found = SimpleNamespace(state={"config": saved, "data_identity": "d"}, path=Path("step_0000004"))
    logs: list[str] = []
    assert check_compatible(found, cfg, data, allow=False, log=logs.append) == []
    assert any("train.micro_batch_size changed from 4 to 8" in x for x in logs)
    for key, value in (("batch_size", 32), ("seed", 7)):
        other = C.load(TINY, sets=[f"train.{key}={value}"])
        with pytest.raises(X1Error, match=rf"train\.{key}: "):
            check_compatible(found, other, data, allow=False, log=logs.append)
