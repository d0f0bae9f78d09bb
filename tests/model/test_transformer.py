from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from x1_pretrain.core.config import ModelConfig
from x1_pretrain.model.transformer import (
    Kernels,
    Transformer,
    apply_rope,
    attention_reference,
    causal_attention,
    flash_available,
    hf_config,
    rope_tables,
    state_dict_for_saving,
)

SMALL = ModelConfig(n_layer=2, d_model=96, n_head=6, n_kv_head=2, d_ff=160, seq_len=48, vocab_size=1000)


@pytest.mark.parametrize("kv", [1, 2, 6])
def test_sdpa_path_matches_naive_reference(kv):
    torch.manual_seed(0)
    q = torch.randn(2, 40, 6, 16)
    k = torch.randn(2, 40, kv, 16)
    v = torch.randn(2, 40, kv, 16)
    torch.testing.assert_close(
        causal_attention(q, k, v, use_flash=False), attention_reference(q, k, v), atol=2e-5, rtol=1e-4
    )


def test_flash_request_without_cuda_uses_sdpa_and_matches():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 8, 4, 8), torch.randn(1, 8, 2, 8), torch.randn(1, 8, 2, 8)
    torch.testing.assert_close(
        causal_attention(q, k, v, use_flash=True), attention_reference(q, k, v), atol=2e-5, rtol=1e-4
    )


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and flash_available()), reason="needs CUDA and flash-attn")
def test_flash_path_matches_reference_on_gpu():
    torch.manual_seed(2)
    q = torch.randn(2, 64, 12, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(
        causal_attention(q, k, v, use_flash=True).float(), attention_reference(q, k, v).float(), atol=2e-2, rtol=2e-2
    )


def test_attention_is_causal():
    torch.manual_seed(3)
    model = Transformer(SMALL).eval()
    idx = torch.randint(0, 1000, (1, 20))
    changed = idx.clone()
    changed[0, 15:] = (changed[0, 15:] + 7) % 1000
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :15], b[:, :15])
    assert not torch.allclose(a[:, 15:], b[:, 15:])


def test_rope_is_a_rotation_with_relative_positions():
    cos, sin = rope_tables(16, 32, 10000.0)
    x = torch.randn(1, 32, 2, 16)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    q = torch.randn(16)
    k = torch.randn(16)
    qs = apply_rope(q.expand(1, 32, 1, 16).contiguous(), cos, sin)[0, :, 0]
    ks = apply_rope(k.expand(1, 32, 1, 16).contiguous(), cos, sin)[0, :, 0]
    torch.testing.assert_close(qs[5] @ ks[2], qs[20] @ ks[17], atol=1e-4, rtol=1e-4)


def test_tied_embedding_and_names_follow_llama():
    model = Transformer(SMALL)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    names = set(state_dict_for_saving(model))
    assert "lm_head.weight" not in names
    for n in [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
    ]:
        assert n in names, n


def test_init_std():
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(n_layer=1, d_model=256, n_head=4, n_kv_head=2, d_ff=512, seq_len=8, vocab_size=4000)
    )
    assert abs(model.model.embed_tokens.weight.std().item() - 0.02) < 1e-3
    assert torch.all(model.model.norm.weight == 1)


def test_loss_at_init_is_near_log_vocab():
    torch.manual_seed(0)
    model = Transformer(SMALL)
    idx = torch.randint(0, 1000, (4, 48))
    loss = model(idx, torch.randint(0, 1000, (4, 48))).item()
    assert abs(loss - torch.log(torch.tensor(1000.0)).item()) < 0.3


@pytest.mark.parametrize(
    "variant", [{}, {"fused_projections": True}, {"tie_embeddings": False}, {"vocab_pad_multiple": 1}]
)
def test_same_logits_and_loss_as_transformers_llama(variant):
    """Padding (1000 -> 1024 rows here), fused projections and an untied head change tensors inside the model
    only: the saved weights load into transformers' Llama, the logits match, and the one-pass loss equals the
    cross-entropy of Llama's logits."""
    transformers = pytest.importorskip("transformers")
    m = dataclasses.replace(SMALL, **variant)
    torch.manual_seed(0)
    ours = Transformer(m).eval()
    for p in ours.parameters():  # non-trivial norm gains too (and non-zero padding rows: they must not matter)
        p.data.add_(0.01 * torch.randn_like(p))
    cfg = {k: v for k, v in hf_config(m).items() if k != "architectures"}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
    missing, unexpected = hf.load_state_dict(state_dict_for_saving(ours), strict=False)
    assert unexpected == [] and set(missing) <= ({"lm_head.weight"} if m.tie_embeddings else set())
    if m.tie_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    idx, y = torch.randint(0, 1000, (2, 48)), torch.randint(0, 1000, (2, 48))
    with torch.no_grad():
        theirs = hf(idx).logits
        torch.testing.assert_close(ours(idx), theirs, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            ours(idx, y), F.cross_entropy(theirs.reshape(-1, 1000), y.reshape(-1)), atol=1e-5, rtol=1e-6
        )


def test_padding_and_fused_projections_change_nothing_a_user_sees():
    """Same seed, same init: the padded model's state dict equals the unpadded one's bit for bit and its logits
    too (the extra rows start at zero and are never part of a softmax); fused projections save the same tensors
    under Llama's names and load back from them, strictly."""
    base = dataclasses.replace(SMALL, vocab_pad_multiple=1)
    models = {}
    variants = {"plain": base, "padded": SMALL, "fused": dataclasses.replace(SMALL, fused_projections=True)}
    for name, m in variants.items():
        torch.manual_seed(7)
        models[name] = Transformer(m)
    plain = models["plain"].state_dict()
    for name in ("padded", "fused"):
        sd = models[name].state_dict()
        assert list(sd) == list(plain) if name == "padded" else sorted(sd) == sorted(plain)
        assert all(torch.equal(sd[k], plain[k]) for k in plain), name
    padded = models["padded"]
    assert padded.model.embed_tokens.weight.shape == (1024, 96) and plain["model.embed_tokens.weight"].shape[0] == 1000
    assert torch.all(padded.model.embed_tokens.weight[1000:] == 0)
    idx = torch.randint(0, 1000, (2, 48))
    with torch.no_grad():
        assert torch.equal(padded(idx), models["plain"](idx))
        torch.testing.assert_close(models["fused"](idx), models["plain"](idx), atol=1e-5, rtol=1e-5)
    again = Transformer(dataclasses.replace(SMALL, fused_projections=True))
    again.load_state_dict(plain, strict=True)  # Llama names into the fused layout
    assert all(torch.equal(again.state_dict()[k], plain[k]) for k in plain)
    assert (
        not hasattr(again.model.layers[0].self_attn, "q_proj")
        and "fused" in dict(again.named_modules())["model.layers.0.self_attn"]._modules
    )


def test_padding_rows_never_learn():
    """Rows 1000..1023 of the padded embedding get no gradient from the head (no probability) nor from the
    input (no token has those ids), so weight decay and AdamW leave them at zero."""
    torch.manual_seed(0)
    model = Transformer(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for fused in (True, False):
        model.set_kernels(Kernels(fused_loss=fused))
        idx = torch.randint(0, 1000, (2, 48))
        model(idx, torch.roll(idx, -1, 1)).backward()
        assert torch.all(model.model.embed_tokens.weight.grad[1000:] == 0)
        opt.step()
        opt.zero_grad()
    assert torch.all(model.model.embed_tokens.weight[1000:] == 0)


def test_bf16_residual_stream_is_bf16_and_norms_stay_fp32():
    torch.manual_seed(0)
    model = Transformer(SMALL)
    seen: dict[str, torch.dtype] = {}
    model.model.layers[1].register_forward_hook(lambda mod, args, out: seen.__setitem__("residual", out.dtype))
    model.model.norm.register_forward_pre_hook(lambda mod, args: seen.__setitem__("norm in", args[0].dtype))
    idx = torch.randint(0, 1000, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp32_loss = model(idx, idx)
        assert seen["residual"] == torch.float32
        model.set_kernels(Kernels(residual_dtype=torch.bfloat16))
        bf16_loss = model(idx, idx)
    assert seen["residual"] == torch.bfloat16 and seen["norm in"] == torch.bfloat16
    assert bf16_loss.dtype == torch.float32 and abs(float(bf16_loss.detach()) - float(fp32_loss.detach())) < 0.05


def test_too_long_sequence_is_refused():
    with pytest.raises(ValueError, match=r"longer than model\.seq_len"):
        Transformer(SMALL)(torch.zeros(1, 49, dtype=torch.long))
