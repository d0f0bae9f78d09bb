"""AdamW with decay on 2-D weight matrices only (norm gains and, by default, the tied embedding are not
decayed; the reason is in configs/x1-50m-a100.yaml); fused on CUDA."""

from __future__ import annotations

from typing import Any


def build_optimizer(model: Any, cfg: Any, device: Any) -> Any:
    import torch

    emb = model.model.embed_tokens.weight
    decay, no_decay = [], []
    for _, p in model.named_parameters():  # the tied embedding appears once
        if p.dim() >= 2 and (p is not emb or cfg.optim.decay_embedding):
            decay.append(p)
        else:
            no_decay.append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs: dict[str, Any] = {"lr": cfg.optim.lr, "betas": (cfg.optim.beta1, cfg.optim.beta2), "eps": cfg.optim.eps}
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)
