"""Bits per byte, against a hand computation on a tiny model with a real tokenizer's byte table."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np
import torch

from x1_pretrain.core.config import ModelConfig
from x1_pretrain.data import hf_tokenizer
from x1_pretrain.model.transformer import Transformer
from x1_pretrain.trainer.loop import val_scores


def test_val_bpb_is_text_nats_over_ln2_over_text_bytes(bpe_data):
    tok = hf_tokenizer.load_tokenizer_json(bpe_data / "tokenizer.json")
    table = torch.from_numpy(tok.token_bytes())
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(n_layer=1, d_model=32, n_head=2, n_kv_head=1, d_ff=64, seq_len=16, vocab_size=tok.vocab_size)
    )
    val = np.fromfile(bpe_data / "val.bin", dtype=np.uint16).astype(np.int64)
    at = int(np.flatnonzero(val == tok.eot_id)[0]) - 8  # the first window spans a document end
    rows = torch.from_numpy(np.stack([val[at + i * 16 : at + i * 16 + 17] for i in range(6)]))
    batches = [(rows[:3, :-1], rows[:3, 1:]), (rows[3:, :-1], rows[3:, 1:])]
    assert (rows[:, 1:] == tok.eot_id).any(), "the windows hold a document end (0 bytes): it is left out"
    run = SimpleNamespace(
        raw_model=model,
        val_batches=batches,
        val_token_bytes=table,
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext(),
    )
    loss, bpb = val_scores(run)
    # by hand: full logits, log-softmax, the targets' nats; the text targets' sum over their UTF-8 bytes
    model.eval()
    with torch.no_grad():
        nats = torch.cat(
            [-torch.log_softmax(model(x).double(), -1).gather(-1, y[..., None]).reshape(-1) for x, y in batches]
        )
    y = torch.cat([y.reshape(-1) for _, y in batches])
    text = y != tok.eot_id
    n_bytes = sum(len(tok.decode([int(i)]).encode("utf-8")) for i in y[text])  # bytes of each piece, decoded
    assert math.isclose(loss, float(nats.mean()), rel_tol=1e-5)
    assert math.isclose(bpb, float(nats[text].sum()) / math.log(2) / n_bytes, rel_tol=1e-5)
    assert 0 < bpb < loss / math.log(2)  # more than one byte a token on this text
    # no byte table (a tokenizer that cannot be loaded): NaN, the loss unchanged
    run.val_token_bytes = None
    loss2, bpb2 = val_scores(run)
    assert loss2 == loss and math.isnan(bpb2)
