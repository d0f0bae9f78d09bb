"""A Llama-style decoder: token embedding → n_layer × (RMSNorm → GQA attention with RoPE → residual;
RMSNorm → SwiGLU → residual) → RMSNorm → LM head tied to the embedding.

Parameter names and the RoPE convention (rotate-half) are those of transformers' ``LlamaForCausalLM``,
so the state dict loads there unchanged (see ``hf_config``) and gives the same logits.

Two speed choices change tensors inside the model but never what leaves it:
- ``model.vocab_pad_multiple``: the embedding / LM head hold ``vocab_size`` rounded up (50,257 → 50,304 at
  128) so the head's GEMM has tensor-core friendly shapes. The extra rows start at zero, get no gradient
  and no probability; the state dict, the logits and the loss are those of ``vocab_size`` rows.
- ``model.fused_projections``: q/k/v in one matmul and gate/up in one; the state dict is split back into
  Llama's ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj``, and loads from them.
How the forward runs (attention kernel, the one-pass loss, a bf16 residual stream) is :class:`Kernels`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import replace as dataclasses_replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..core.config import ModelConfig
from .loss import linear_cross_entropy

try:  # flash-attn 2 is optional: the NVIDIA PyTorch container ships it; CPUs never have it
    from flash_attn import flash_attn_func
except Exception:  # ImportError, or a broken build raising OSError/RuntimeError at import
    flash_attn_func = None

_SDPA_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")


def flash_available() -> bool:
    return flash_attn_func is not None


def flash_compiles() -> bool:
    """Whether torch.compile traces flash-attn without a graph break: flash-attn ≥ 2.7 registers its kernels
    as torch custom ops (``torch.ops.flash_attn``); older builds (a pybind call in an autograd.Function)
    break the graph at every attention call."""
    if flash_attn_func is None:
        return False
    try:
        return hasattr(torch.ops.flash_attn, "_flash_attn_forward")
    except (AttributeError, RuntimeError):
        return False


def flash_has_deterministic_backward() -> bool:
    """flash-attn >= 2.4.1 takes ``deterministic=True`` (a slower backward without atomic adds)."""
    import inspect

    if flash_attn_func is None:
        return False
    try:
        return "deterministic" in inspect.signature(flash_attn_func).parameters
    except (TypeError, ValueError):
        return False


@dataclass
class Kernels:
    """How the forward runs; none of it changes the parameters or the state dict.

    use_flash: flash-attn 2 for attention on CUDA (else SDPA, which picks its own flash backend).
    fused_loss / loss_chunk_tokens: the LM head and cross-entropy in one pass over token chunks (``loss.py``)
      instead of ``F.cross_entropy`` on the full fp32 logits.
    residual_dtype: the dtype of the residual stream (bf16 under bf16 autocast with ``train.bf16_residual``),
      None to keep the embedding's fp32. RMSNorm normalises in fp32 either way.
    deterministic: flash-attn's deterministic backward (``train.deterministic``).
    """

    use_flash: bool = False
    fused_loss: bool = True
    loss_chunk_tokens: int = 4096
    residual_dtype: torch.dtype | None = None
    deterministic: bool = False


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


def rope_tables(
    head_dim: int, seq_len: int, base: float, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, head_dim) in fp32, rotate-half layout (frequencies repeated twice)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    t = torch.arange(seq_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(t, inv_freq)  # (T, hd/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, hd)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, H, hd); cos/sin: (T, hd), or (B, T, hd) where each row has its own positions."""
    if cos.dim() == 3:
        cos, sin = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    else:
        cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
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


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Attention under an explicit mask (B, 1, T, T), True where a query may see a key: several sequences
    packed in one row (an evaluation's context shared by its endings). q: (B, T, H, hd); k, v: (B, T, KV, hd)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
    if k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, use_flash: bool, deterministic: bool = False
) -> torch.Tensor:
    """q: (B, T, H, hd); k, v: (B, T, KV, hd) → (B, T, H, hd)."""
    if use_flash and flash_attn_func is not None and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        if deterministic:
            return flash_attn_func(q, k, v, causal=True, deterministic=True)
        return flash_attn_func(q, k, v, causal=True)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
    if k.shape[1] != q.shape[1]:
        # SDPA's GQA mode runs on its flash backend (CUDA, half precision) or its math one; fp32 on a GPU would
        # land on math (T x T scores in memory), so there the K/V heads are repeated for the efficient backend.
        if _SDPA_HAS_GQA and (not q.is_cuda or q.dtype in (torch.bfloat16, torch.float16)):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return y.transpose(1, 2)
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


SDPA_BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}  # torch's SDPBackend


def sdpa_backend(m: ModelConfig, dtype: torch.dtype, device: torch.device) -> str:
    """The kernel PyTorch's SDPA dispatches :func:`causal_attention` to for this model's shapes, dtype and device,
    as the backends are enabled now (``torch._fused_sdp_choice``, the choice SDPA itself makes): ``math``,
    ``flash``, ``efficient``, ``cudnn``; ``unknown`` where this torch cannot say."""
    q = torch.zeros(1, m.n_head, 8, m.head_dim, dtype=dtype, device=device)
    kv_heads = m.n_kv_head
    gqa = kv_heads != m.n_head and _SDPA_HAS_GQA and (device.type != "cuda" or dtype in (torch.bfloat16, torch.float16))
    if kv_heads != m.n_head and not gqa:
        kv_heads = m.n_head  # causal_attention repeats the K/V heads there
    k = torch.zeros(1, kv_heads, 8, m.head_dim, dtype=dtype, device=device)
    try:
        choose: Any = torch._fused_sdp_choice
        choice = choose(q, k, k, is_causal=True, enable_gqa=True) if gqa else choose(q, k, k, is_causal=True)
    except (AttributeError, RuntimeError, TypeError):
        return "unknown"
    return SDPA_BACKENDS.get(int(choice), "unknown")


class FusedLinear(nn.Linear):
    """Several bias-free projections of the same input in one matmul. The state dict holds the parts under
    their own names (``names``, rows ``sizes``) and loads from them, so checkpoints and exports keep Llama's
    layout; initialisation draws each part in turn, as separate ``nn.Linear``s would."""

    def __init__(self, in_features: int, names: tuple[str, ...], sizes: tuple[int, ...]) -> None:
        super().__init__(in_features, sum(sizes), bias=False)
        self.names, self.sizes = names, sizes

    def parts(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.weight.split(self.sizes, dim=0))

    def init_parts(self, std: float) -> None:
        with torch.no_grad():
            for part in self.parts():
                nn.init.normal_(part, mean=0.0, std=std)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        parent = prefix[: -len("fused.")]  # the parts sit beside it, under the parent's prefix
        for name, part in zip(self.names, self.parts(), strict=True):
            destination[f"{parent}{name}.weight"] = part if keep_vars else part.detach()


class FusedParent(nn.Module):
    """A module that may hold a ``fused`` :class:`FusedLinear`: loading turns the parts' Llama names into the
    fused weight before the strict key check of this module sees them."""

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        fused = self._modules.get("fused")
        if isinstance(fused, FusedLinear):
            keys = [f"{prefix}{name}.weight" for name in fused.names]
            if all(k in state_dict for k in keys):
                state_dict[f"{prefix}fused.weight"] = torch.cat([state_dict.pop(k) for k in keys], dim=0)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class Attention(FusedParent):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = m.n_head, m.n_kv_head, m.head_dim
        q_out, kv_out = m.n_head * m.head_dim, m.n_kv_head * m.head_dim
        self.sizes = (q_out, kv_out, kv_out)
        if m.fused_projections:
            self.fused = FusedLinear(m.d_model, ("q_proj", "k_proj", "v_proj"), self.sizes)
        else:
            self.q_proj = nn.Linear(m.d_model, q_out, bias=False)
            self.k_proj = nn.Linear(m.d_model, kv_out, bias=False)
            self.v_proj = nn.Linear(m.d_model, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, m.d_model, bias=False)
        self.kernels = Kernels()

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        B, T, _ = x.shape
        if hasattr(self, "fused"):
            q, k, v = self.fused(x).split(self.sizes, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, self.n_head, self.head_dim)
        k = k.view(B, T, self.n_kv_head, self.head_dim)
        v = v.view(B, T, self.n_kv_head, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if mask is None:
            y = causal_attention(q, k, v, self.kernels.use_flash, self.kernels.deterministic)  # (B, T, H, hd)
        else:
            y = masked_attention(q, k, v, mask)
        return self.o_proj(y.reshape(B, T, self.n_head * self.head_dim))


class MLP(FusedParent):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        if m.fused_projections:
            self.fused = FusedLinear(m.d_model, ("gate_proj", "up_proj"), (m.d_ff, m.d_ff))
        else:
            self.gate_proj = nn.Linear(m.d_model, m.d_ff, bias=False)
            self.up_proj = nn.Linear(m.d_model, m.d_ff, bias=False)
        self.down_proj = nn.Linear(m.d_ff, m.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "fused"):
            gate, up = self.fused(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(m.d_model, m.norm_eps)
        self.self_attn = Attention(m)
        self.post_attention_layernorm = RMSNorm(m.d_model, m.norm_eps)
        self.mlp = MLP(m)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def padded_vocab(m: ModelConfig) -> int:
    """``vocab_size`` rounded up to ``vocab_pad_multiple`` (50,257 → 50,304 at 128)."""
    k = max(1, m.vocab_pad_multiple)
    return -(-m.vocab_size // k) * k


class VocabRows:
    """A weight with one row per token, ``vocab`` real rows and zero padding rows after them. Its state dict
    entry has the ``vocab`` real rows only; loading one pads it with zero rows again."""

    vocab: int
    weight: torch.Tensor

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        w = self.weight[: self.vocab]
        destination[f"{prefix}weight"] = w if keep_vars else w.detach()

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        key = f"{prefix}weight"
        w = state_dict.get(key)
        rows = self.weight.shape[0]
        if w is not None and w.dim() == 2 and w.shape[0] == self.vocab < rows:
            state_dict[key] = torch.cat([w, w.new_zeros(rows - self.vocab, w.shape[1])])
        super()._load_from_state_dict(
            state_dict,
            prefix,
            local_metadata,
            strict,  # type: ignore[misc]
            missing_keys,
            unexpected_keys,
            error_msgs,
        )


class VocabEmbedding(VocabRows, nn.Embedding):
    def __init__(self, vocab: int, rows: int, dim: int) -> None:
        nn.Embedding.__init__(self, rows, dim)
        self.vocab = vocab


class VocabHead(VocabRows, nn.Linear):
    def __init__(self, dim: int, vocab: int, rows: int) -> None:
        nn.Linear.__init__(self, dim, rows, bias=False)
        self.vocab = vocab


class Body(nn.Module):
    """The ``model.`` prefix of Llama's parameter names."""

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(m.vocab_size, padded_vocab(m), m.d_model)
        self.layers = nn.ModuleList(Block(m) for _ in range(m.n_layer))
        self.norm = RMSNorm(m.d_model, m.norm_eps)


class Transformer(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        # The submodules' own default inits draw random numbers in proportion to their sizes; drawing ours from
        # the state they started at makes the init the same with or without padding or fused projections.
        rng = torch.get_rng_state()
        self.config = m
        self.kernels = Kernels()
        self.model = Body(m)
        self.lm_head = VocabHead(m.d_model, m.vocab_size, padded_vocab(m))
        if m.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(m.head_dim, m.seq_len, m.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        torch.set_rng_state(rng)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal init of every matrix, ones for the norms; the same random draws with or without vocab padding
        and fused projections (padding rows are zero), so those switches can be compared from one init."""
        std = self.config.init_std
        with torch.no_grad():
            for mod in self.modules():
                if isinstance(mod, FusedLinear):
                    mod.init_parts(std)
                elif isinstance(mod, VocabRows):
                    nn.init.normal_(mod.weight[: mod.vocab], mean=0.0, std=std)
                    mod.weight[mod.vocab :].zero_()
                elif isinstance(mod, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(mod.weight, mean=0.0, std=std)
                elif isinstance(mod, RMSNorm):
                    nn.init.ones_(mod.weight)

    def set_kernels(self, kernels: Kernels) -> None:
        self.kernels = kernels
        for mod in self.modules():
            if isinstance(mod, Attention):
                mod.kernels = kernels

    def set_attention(self, use_flash: bool) -> None:
        self.set_kernels(dataclasses_replace(self.kernels, use_flash=use_flash))

    def hidden(
        self, idx: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """idx: (B, T) token ids. The final normed hidden states (B, T, d_model): what the LM head reads (an
        evaluation applies the head only where it needs a prediction).

        ``positions`` (B, T) and ``mask`` (B, 1, T, T; True where a query sees a key) pack several sequences in
        a row: each token gets its own RoPE position, and sees only the keys the mask allows (training passes
        neither: positions 0..T-1, causal)."""
        T = idx.shape[1]
        if positions is None:
            if self.config.seq_len < T:
                raise ValueError(f"sequence of {T} tokens is longer than model.seq_len {self.config.seq_len}")
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        else:
            if int(positions.max()) >= self.config.seq_len:  # on a GPU a bad index would be a device assert
                raise ValueError(f"position {int(positions.max())} is past model.seq_len {self.config.seq_len}")
            cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.model.embed_tokens(idx)  # (B, T, C)
        if self.kernels.residual_dtype is not None:
            x = x.to(self.kernels.residual_dtype)
        for block in self.model.layers:
            x = block(x, cos, sin, mask)
        return self.model.norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx: (B, T) token ids. Returns logits (B, T, vocab_size), or the mean cross-entropy if ``targets``."""
        h = self.hidden(idx)
        vocab = self.config.vocab_size
        if targets is not None and self.kernels.fused_loss:
            return linear_cross_entropy(h, self.lm_head.weight, targets, vocab, self.kernels.loss_chunk_tokens)
        logits = self.lm_head(h)  # (B, T, padded vocab)
        if logits.shape[-1] != vocab:
            logits = logits[..., :vocab]
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1))

    @torch.no_grad()
    def token_nats(self, idx: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 4096) -> torch.Tensor:
        """Each target's cross-entropy in nats, (B*T,) fp32: the head taken over ``chunk_tokens`` rows at a time,
        so eval never holds the (tokens x vocab) logits (what the val loss and bits per byte sum)."""
        h = self.hidden(idx).reshape(-1, self.config.d_model)
        y = targets.reshape(-1)
        vocab = self.config.vocab_size
        out = torch.empty(y.shape, dtype=torch.float32, device=h.device)
        for start in range(0, h.shape[0], chunk_tokens):
            stop = min(start + chunk_tokens, h.shape[0])
            logits = self.lm_head(h[start:stop])[..., :vocab].float()
            out[start:stop] = F.cross_entropy(logits, y[start:stop], reduction="none")
        return out


def state_dict_for_saving(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights under transformers-Llama names, without the tied ``lm_head.weight`` duplicate."""
    inner: Any = getattr(model, "_orig_mod", model)  # a torch.compile wrapper
    inner = getattr(inner, "module", inner)  # a DDP wrapper
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
