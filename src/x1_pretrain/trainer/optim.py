"""The optimizer a config names (``optim.name``).

``adamw``: AdamW on every weight, decay on 2-D matrices only (norm gains and, by default, the tied embedding are
not decayed; the reason is in configs/x1-50m-a100.yaml); fused on CUDA.

``muon``: Muon (``trainer/muon.py``) on the hidden matrices, the blocks' attention and MLP projections, each
logical matrix on its own (a fused q/k/v or gate/up weight is handed to Muon as its parts, views of the one
weight); AdamW as above on the rest, the embedding, an untied head and the norm gains. Both follow the
learning-rate schedule: Muon's ``lr`` is ``optim.muon_lr`` times the schedule's factor (:func:`set_lr`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import X1Error

HYBRID_FORMAT = "x1-muon+adamw/1"


def _adamw(params: list[Any], model: Any, cfg: Any, device: Any) -> Any:
    import torch

    emb = model.model.embed_tokens.weight
    decay, no_decay = [], []
    for p in params:
        if p.dim() >= 2 and (p is not emb or cfg.optim.decay_embedding):
            decay.append(p)
        else:
            no_decay.append(p)
    o = cfg.optim
    groups = [
        {"params": decay, "weight_decay": o.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    kwargs: dict[str, Any] = {"lr": o.lr, "betas": (o.beta1, o.beta2), "eps": o.eps}
    if device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


@dataclass(frozen=True)
class Part:
    """One logical matrix of a fused weight: rows ``start:stop`` of ``whole``, handed to Muon as ``view``."""

    view: Any
    whole: Any
    start: int
    stop: int


def hidden_matrices(model: Any) -> tuple[list[Any], list[Part]]:
    """(the blocks' 2-D weights, the parts of their fused ones): what Muon takes, each logical matrix once."""
    import torch

    from ..model.transformer import FusedLinear

    fused = {id(m.weight): m for m in model.model.layers.modules() if isinstance(m, FusedLinear)}
    plain, parts = [], []
    for p in model.model.layers.parameters():
        if p.dim() != 2:
            continue
        if id(p) not in fused:
            plain.append(p)
            continue
        start = 0
        for size in fused[id(p)].sizes:
            view = torch.nn.Parameter(p.data[start : start + size], requires_grad=True)  # shares p's storage
            parts.append(Part(view, p, start, start + size))
            start += size
    return plain, parts


class MuonAdamW:
    """Muon on the hidden matrices and AdamW on the rest, stepped, cleared and saved as one optimizer."""

    def __init__(self, muon: Any, adamw: Any, parts: list[Part], impl: str) -> None:
        self.muon, self.adamw, self.parts, self.impl = muon, adamw, parts, impl
        self.fused = list({id(part.whole): part.whole for part in parts}.values())  # in neither optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [*self.muon.param_groups, *self.adamw.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        """Both optimizers' per-parameter state, to read (a copy: torch's are defaultdicts, and a lookup through
        a view of both would plant empty entries for the other's parameters)."""
        return {**self.muon.state, **self.adamw.state}

    def step(self) -> None:
        for part in self.parts:  # each part's gradient is its rows of the fused weight's (a view: no copy)
            g = part.whole.grad
            part.view.grad = None if g is None else g[part.start : part.stop]
        self.muon.step()
        self.adamw.step()
        for part in self.parts:
            part.view.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)
        for whole in self.fused:
            if whole.grad is not None:
                if set_to_none:
                    whole.grad = None
                else:
                    whole.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"format": HYBRID_FORMAT, "muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != HYBRID_FORMAT:
            raise ValueError(f"the optimizer state was written by {saved_optimizer(state)}, not by muon")
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def saved_optimizer(state: dict[str, Any]) -> str:
    """The ``optim.name`` that wrote an optimizer state dict."""
    return "muon" if state.get("format") == HYBRID_FORMAT else "adamw"


def running_optimizer(optimizer: Any) -> str:
    """The ``optim.name`` of a built optimizer."""
    return "muon" if isinstance(optimizer, MuonAdamW) else "adamw"


def muon_class(impl: str) -> tuple[type, str]:
    """(the Muon class, which one) for ``optim.muon_impl``: auto takes torch's where this torch has it."""
    import torch

    from .muon import Muon, torch_muon

    native = torch_muon()
    if impl == "torch" and native is None:
        raise X1Error(
            f"optim.muon_impl: torch {torch.__version__} has no torch.optim.Muon (added in 2.9); use "
            "--set optim.muon_impl=auto (x1's own Muon, the same update) or a newer torch"
        )
    if impl == "x1" or native is None:
        return Muon, "x1"
    return native, "torch"


def build_optimizer(model: Any, cfg: Any, device: Any) -> Any:
    o = cfg.optim
    if o.name == "adamw":
        return _adamw(list(model.parameters()), model, cfg, device)
    plain, parts = hidden_matrices(model)
    taken = {id(p) for p in plain} | {id(part.whole) for part in parts}
    rest = [p for p in model.parameters() if id(p) not in taken]  # the tied embedding appears once
    cls, impl = muon_class(o.muon_impl)
    muon = cls(
        plain + [part.view for part in parts],
        lr=o.muon_lr,
        weight_decay=o.muon_weight_decay,
        momentum=o.muon_momentum,
        nesterov=o.muon_nesterov,
        ns_steps=o.muon_ns_steps,
        adjust_lr_fn=o.muon_adjust_lr,
    )
    return MuonAdamW(muon, _adamw(rest, model, cfg, device), parts, impl)


def set_lr(optimizer: Any, lr: float, o: Any) -> None:
    """The schedule's ``lr`` (peak ``o.lr``) on every AdamW group; Muon's groups at ``o.muon_lr`` times the same
    factor, so warm-up, decay and the budget fit move both alike."""
    if isinstance(optimizer, MuonAdamW):
        for group in optimizer.muon.param_groups:
            group["lr"] = o.muon_lr * (lr / o.lr)
        optimizer = optimizer.adamw
    for group in optimizer.param_groups:
        group["lr"] = lr


def newton_schulz_flops_per_step(optimizer: Any) -> int:
    """The FLOPs each rank spends orthogonalising Muon's updates in one optimizer step (0 for AdamW)."""
    from .muon import newton_schulz_flops

    if not isinstance(optimizer, MuonAdamW):
        return 0
    return sum(
        newton_schulz_flops(p.shape, group["ns_steps"])
        for group in optimizer.muon.param_groups
        for p in group["params"]
    )


def describe(optimizer: Any) -> str:
    """One line: which optimizer takes which weights."""
    if not isinstance(optimizer, MuonAdamW):
        return "optimizer: AdamW on every weight"
    n_mat = sum(len(g["params"]) for g in optimizer.muon.param_groups)
    n_muon = sum(p.numel() for g in optimizer.muon.param_groups for p in g["params"])
    n_adam = sum(p.numel() for g in optimizer.adamw.param_groups for p in g["params"])
    g = optimizer.muon.param_groups[0]
    return (
        f"optimizer: Muon ({optimizer.impl}'s, momentum {g['momentum']:g}"
        f"{', nesterov' if g['nesterov'] else ''}, {g['ns_steps']} Newton–Schulz steps, lr rule "
        f"{g['adjust_lr_fn'] or 'original'}) on {n_mat} hidden matrices ({n_muon:,} weights"
        f"{f', {len(optimizer.parts)} of them parts of fused projections' if optimizer.parts else ''}); AdamW on "
        f"the embedding, head and norm gains ({n_adam:,})"
    )
