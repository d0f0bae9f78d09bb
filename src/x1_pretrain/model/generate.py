"""Continue a prompt with a model: greedy, or seeded temperature + top-k sampling (``python -m
x1_pretrain.sample`` is the command-line front end)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.errors import X1Error

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 0.0  # 0 is greedy (argmax)
    top_k: int | None = None  # sample among the k likeliest tokens; None keeps them all
    stop_id: int | None = None  # stop at this token (not returned), e.g. <|endoftext|>
    allowed_vocab: int | None = None  # mask the logits of ids the tokenizer cannot decode


def generate(model: Any, ids: list[int], how: Sampling, generator: torch.Generator | None = None) -> list[int]:
    """Extend ``ids`` by up to ``how.max_new_tokens`` tokens; returns the new tokens only."""
    import torch

    device = next(model.parameters()).device
    seq_len = model.config.seq_len
    x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
    new: list[int] = []
    with torch.no_grad():
        for _ in range(how.max_new_tokens):
            logits = model(x[:, -seq_len:])[:, -1, :].float()  # (1, V)
            if how.allowed_vocab is not None and how.allowed_vocab < logits.shape[-1]:
                logits[:, how.allowed_vocab :] = float("-inf")
            if how.temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (1, 1)
            else:
                logits = logits / how.temperature
                if how.top_k is not None and how.top_k < logits.shape[-1]:
                    kth = torch.topk(logits, how.top_k, dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
            token = int(nxt.item())
            if how.stop_id is not None and token == how.stop_id:
                break
            new.append(token)
            x = torch.cat([x, nxt.to(x.dtype)], dim=1)
    return new


def pick_device(name: str) -> Any:
    """``auto`` (CUDA when visible), ``cpu``, ``cuda`` or ``cuda:N``; a CUDA name without CUDA is a usage error."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise X1Error(f"--device {name}: no CUDA device is visible; use --device cpu")
    return dev
