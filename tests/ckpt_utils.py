"""Helpers that write real checkpoint dirs from a small random x1 model (no training)."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from x1_pretrain.ckpt import checkpoint as ck
from x1_pretrain.core.config import Config, ModelConfig
from x1_pretrain.model.transformer import Transformer, state_dict_for_saving

# GPT-2's vocabulary (the tokenizer test needs it), everything else tiny; a non-default RoPE base so a
# converter that ignored it would give other logits.
TINY_GPT2 = ModelConfig(
    n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=96, seq_len=32, vocab_size=50257, rope_base=500.0
)
SMALL_VOCAB = ModelConfig(n_layer=1, d_model=32, n_head=4, n_kv_head=2, d_ff=48, seq_len=16, vocab_size=1000)


def random_model(m: ModelConfig, seed: int = 0) -> Transformer:
    """A random model with non-trivial norm gains (so a missing norm weight would show)."""
    torch.manual_seed(seed)
    model = Transformer(m)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return model.eval()


def write_checkpoint(ckpt_dir: Path, model: Transformer, step: int = 7, final: bool = False) -> Path:
    """A complete step dir (DONE, hashes, trainer_state.json with the resolved config), like the trainer's."""
    cfg = Config(model=model.config)
    state = {"step": step, "tokens_seen": step * 1000, "config": cfg.to_dict(), "config_sha256": cfg.sha256()}
    path, _ = ck.write_step_dir(ckpt_dir, ck.StepSnapshot(step, state_dict_for_saving(model), {}, state))
    if final:
        ck.write_final_files(ckpt_dir, path)
    return path


def write_config_yaml(path: Path, m: ModelConfig) -> Path:
    path.write_text(yaml.safe_dump({"model": Config(model=m).to_dict()["model"]}))
    return path
