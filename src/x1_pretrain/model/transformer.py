"""A Llama-style decoder: token embedding → n_layer × (RMSNorm → GQA attention with RoPE → residual;
RMSNorm → SwiGLU → residual) → RMSNorm → LM head tied to the embedding.

Parameter names and the RoPE convention (rotate-half) are those of transformers' ``LlamaForCausalLM``,
so the state dict loads there unchanged (see ``hf_config``) and gives the same logits.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.config import ModelConfig

try:  # flash-attn 2 is optional: the NVIDIA PyTorch container ships it; CPUs never have it
    from flash_attn import flash_attn_func
except Exception:  # ImportError, or a broken build raising OSError/RuntimeError at import
    flash_attn_func = None

_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def flash_available() -> bool:
    return flash_attn_func is not None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 whatever the input dtype, as Llama does
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(head_dim: int, seq_len: int, base: float, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, head_dim) in fp32, rotate-half layout (frequencies repeated twice)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    t = torch.arange(seq_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(t, inv_freq)               # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)        # (T, hd)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, hd); cos/sin: (T, hd)."""
    cos = cos[None, :, None, :].to(x.dtype)
    sin = sin[None, :, None, :].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Naive causal GQA attention, for tests. q: (B, T, H, hd); k, v: (B, T, KV, hd) → (B, T, H, hd)."""
    groups = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q.float(), k.float()) / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v.float()).to(q.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, use_flash: bool) -> torch.Tensor:
    """q: (B, T, H, hd); k, v: (B, T, KV, hd) → (B, T, H, hd)."""
    if use_flash and flash_attn_func is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        return flash_attn_func(q, k, v, causal=True)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
    if k.shape[1] != q.shape[1]:
        if _SDPA_HAS_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return y.transpose(1, 2)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = m.n_head, m.n_kv_head, m.head_dim
        self.q_proj = nn.Linear(m.d_model, m.n_head * m.head_dim, bias=False)
        self.k_proj = nn.Linear(m.d_model, m.n_kv_head * m.head_dim, bias=False)
        self.v_proj = nn.Linear(m.d_model, m.n_kv_head * m.head_dim, bias=False)
        self.o_proj = nn.Linear(m.n_head * m.head_dim, m.d_model, bias=False)
        self.use_flash = False

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = causal_attention(q, k, v, self.use_flash)  # (B, T, H, hd)
        return self.o_proj(y.reshape(B, T, self.n_head * self.head_dim))


class MLP(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(m.d_model, m.d_ff, bias=False)
        self.up_proj = nn.Linear(m.d_model, m.d_ff, bias=False)
        self.down_proj = nn.Linear(m.d_ff, m.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(m.d_model, m.norm_eps)
        self.self_attn = Attention(m)
        self.post_attention_layernorm = RMSNorm(m.d_model, m.norm_eps)
        self.mlp = MLP(m)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """The ``model.`` prefix of Llama's parameter names."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(m.vocab_size, m.d_model)
        self.layers = nn.ModuleList(Block(m) for _ in range(m.n_layer))
        self.norm = RMSNorm(m.d_model, m.norm_eps)


class Transformer(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.config = m
        self.model = Body(m)
        self.lm_head = nn.Linear(m.d_model, m.vocab_size, bias=False)
        if m.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(m.head_dim, m.seq_len, m.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.init_std
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, mean=0.0, std=std)
            elif isinstance(mod, RMSNorm):
                nn.init.ones_(mod.weight)

    def set_attention(self, use_flash: bool) -> None:
        for mod in self.modules():
            if isinstance(mod, Attention):
                mod.use_flash = use_flash

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) token ids. Returns logits (B, T, V), or the mean cross-entropy if ``targets``."""
        T = idx.shape[1]
        if self.config.seq_len < T:
            raise ValueError(f"sequence of {T} tokens is longer than model.seq_len {self.config.seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.model.embed_tokens(idx)  # (B, T, C)
        for block in self.model.layers:
            x = block(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def state_dict_for_saving(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights under transformers-Llama names, without the tied ``lm_head.weight`` duplicate."""
    inner: Any = getattr(model, "_orig_mod", model)   # a torch.compile wrapper
    inner = getattr(inner, "module", inner)           # a DDP wrapper
    sd = inner.state_dict()
    if inner.config.tie_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def hf_config(m: ModelConfig) -> dict[str, Any]:
    """A transformers ``LlamaConfig`` dict for this model (no transformers import needed)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "intermediate_size": m.d_ff,
        "num_hidden_layers": m.n_layer,
        "num_attention_heads": m.n_head,
        "num_key_value_heads": m.n_kv_head,
        "head_dim": m.head_dim,
        "max_position_embeddings": m.seq_len,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_base,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": m.tie_embeddings,
        "initializer_range": m.init_std,
        "bos_token_id": m.vocab_size - 1,  # GPT-2 uses <|endoftext|> (the last id) for both
        "eos_token_id": m.vocab_size - 1,
    }


