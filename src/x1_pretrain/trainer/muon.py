"""Muon for the hidden matrices: momentum, then an approximate orthogonalisation of the update by a quintic
Newton–Schulz iteration (Jordan et al. 2024; "Muon is Scalable for LLM Training", Liu et al. 2025).

``torch.optim.Muon`` is used where torch has it (2.9 and later); :class:`Muon` here is x1's own for older torch
(the users' container ships 2.5). Both keep the same state (``momentum_buffer``) and the same param-group keys,
so a checkpoint written by one resumes under the other. Ours runs the iteration in bf16 on a GPU (as torch's
does) and in fp32 on a CPU, where bf16 matmuls are slow and no faster than fp32;
``tests/trainer/test_muon.py`` holds the two to stated tolerances on the same gradients.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# The quintic's coefficients (a, b, c): the published ones, which push small singular values up fast and leave
# the rest in roughly [0.7, 1.2], which trains as well as an exact U V^T at a fraction of the cost.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
ADJUST_RULES = ("original", "match_rms_adamw")


def orthogonalise(
    g: torch.Tensor,
    steps: int,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = NS_EPS,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``g`` (2-D) mapped towards the nearest semi-orthogonal matrix by ``steps`` rounds of
    X <- a X + (b A + c A^2) X with A = X X^T, in ``dtype``; the wide orientation is used so that A is the small
    Gram matrix. Returned in ``dtype``."""
    if g.dim() != 2:
        raise ValueError(f"Newton–Schulz needs a matrix, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def adjusted_lr(lr: float, rule: str | None, shape: torch.Size | tuple[int, ...]) -> float:
    """The step size for a matrix of ``shape`` (rows = outputs): ``original`` scales by sqrt(max(1, rows/cols))
    (Keller Jordan's); ``match_rms_adamw`` by 0.2 sqrt(max(rows, cols)), which gives the update AdamW's RMS so
    AdamW's learning rate and weight decay carry over (Moonshot's)."""
    rows, cols = shape[0], shape[1]
    if rule is None or rule == "original":
        return lr * math.sqrt(max(1.0, rows / cols))
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"unknown Muon learning-rate rule {rule!r} (one of {', '.join(ADJUST_RULES)})")


def newton_schulz_flops(shape: torch.Size | tuple[int, ...], steps: int) -> int:
    """Multiply-adds x 2 of one orthogonalisation: per round X X^T (2 m m n), A A (2 m^3) and the product with X
    (2 m m n), with m <= n the matrix's short and long sides."""
    m, n = sorted((int(shape[0]), int(shape[1])))
    return steps * (4 * m * m * n + 2 * m**3)


class Muon(torch.optim.Optimizer):
    """x1's Muon, for a torch without ``torch.optim.Muon``: the same update and the same state as torch's.

    Per matrix: buf <- mu buf + (1 - mu) g; the update is (1 - mu) g + mu buf (Nesterov) or buf; it is
    orthogonalised; the weight decays by lr * wd and moves by the adjusted lr times the orthogonalised update.
    The coefficients and epsilon are torch's (group keys ``ns_coefficients``, ``eps``, as torch saves them)."""

    def __init__(
        self,
        params: Any,
        lr: float = 0.02,
        weight_decay: float = 0.0,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
    ) -> None:
        if lr < 0 or weight_decay < 0 or not 0 <= momentum < 1 or not 1 <= ns_steps < 100:
            raise ValueError("Muon: lr and weight_decay >= 0, momentum in [0, 1), ns_steps in [1, 99]")
        if adjust_lr_fn is not None and adjust_lr_fn not in ADJUST_RULES:
            raise ValueError(f"Muon: adjust_lr_fn must be one of {', '.join(ADJUST_RULES)}, got {adjust_lr_fn!r}")
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": NS_COEFFICIENTS,
            "eps": NS_EPS,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
        }
        super().__init__(params, defaults)
        self.ns_dtype: torch.dtype | None = None  # the iteration's dtype; None: bf16 on CUDA, fp32 elsewhere
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon takes matrices only, got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mu = float(group["lr"]), group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(g, 1 - mu)
                update = g.lerp(buf, mu) if group["nesterov"] else buf
                dtype = self.ns_dtype or (torch.bfloat16 if p.device.type == "cuda" else torch.float32)
                o = orthogonalise(update, group["ns_steps"], tuple(group["ns_coefficients"]), group["eps"], dtype)
                p.mul_(1 - lr * wd)
                p.add_(o.to(p.dtype), alpha=-adjusted_lr(lr, group["adjust_lr_fn"], p.shape))
        return loss


def torch_muon() -> type | None:
    """``torch.optim.Muon`` when this torch has it, else None."""
    return getattr(torch.optim, "Muon", None)
