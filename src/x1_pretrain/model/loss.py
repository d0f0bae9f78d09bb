"""The LM head and its cross-entropy in one pass, without the (tokens × vocab) logits in memory.

The plain route, ``F.cross_entropy(lm_head(h).float(), y)``, keeps the logits (bf16), their fp32 copy, the
log-softmax and the gradient of each alive at once: at the lab's micro-batch (32 × 1024 tokens, 50,304
padded columns) that is 3.3 GB of bf16 logits plus 6.6 GB for every fp32 tensor of that shape.

Here the tokens are taken in chunks. For each chunk the forward computes the logits, the loss, and, since
the cross-entropy is the last operation of the graph, already the gradient ``softmax - onehot`` and what it
means for the hidden states and the head's weight (llm.c's fused classifier does the same in one kernel).
The backward then only scales those two saved gradients by the incoming scalar. Nothing of the
(chunk × vocab) size survives the forward.

Columns from ``vocab`` on (the padding of the head to a multiple of 128, see ``transformer.py``) get no
probability and no gradient. Under autocast the matmuls run in the autocast dtype, as ``nn.Linear`` would,
the log-sum-exp and the loss in fp32, and the gradient is handed to the two gradient matmuls in the autocast
dtype. In no-grad mode (eval) the gradient work is skipped.

Two ways to the same numbers, one per executor:
- eager (``_chunk_in_place``): one fp32 (chunk × vocab) buffer reused in place (sub, exp, the softmax scaled
  by 1/N in one pass, the onehot subtracted on its n cells), so the peak per chunk is that buffer (4 bytes an
  element; under bf16 6 at a moment: the bf16 logits beside it, later its bf16 cast): 4096 × 50,304 is
  0.8 GB fp32, 1.2 GB at the peak;
- under torch.compile (``_chunk_fused``): pure functions Inductor fuses, a reduction reading the logits for
  the fp32 log-sum-exp and one pointwise kernel reading them again and writing the gradient in the autocast
  dtype, with the onehot as a comparison (an in-place index_put would keep Inductor from fusing the softmax
  into the cast). Per element: the matmul's write, two or three reads and one write of the gradient, instead
  of the fp32 copy and its five passes.
"""

from __future__ import annotations

import torch


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would use for ``h`` here: the autocast dtype inside autocast, else h's own."""
    kind = h.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return h.dtype


def _is_compiling() -> bool:
    check = getattr(torch.compiler, "is_compiling", None)
    return bool(check()) if check is not None else False


def _chunk_in_place(
    logits: torch.Tensor, ys: torch.Tensor, vocab: int, scale: float, want_grad: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Eager: (summed loss, gradient in ``dtype`` or None) of one chunk through one fp32 buffer reused in place,
    so no second buffer of this size is ever allocated (torch.logsumexp would allocate one)."""
    x = logits.float()  # (n, Vp), the only big fp32 buffer
    if x.shape[1] > vocab:
        x[:, vocab:] = float("-inf")  # padding: no probability
    picked = x.gather(1, ys[:, None]).squeeze(1)  # (n,)
    top = x.amax(dim=1)  # (n,)
    total_exp = x.sub_(top[:, None]).exp_().sum(dim=1)  # x now holds exp(logit - top)
    loss = (top + total_exp.log() - picked).sum()
    if not want_grad:
        return loss, None
    # d(mean loss)/d(logits) = (softmax - onehot) / N: the softmax and the 1/N in one pass, the onehot on n cells
    grad = x.mul_((scale / total_exp)[:, None])
    grad[torch.arange(x.shape[0], device=x.device), ys] -= scale  # unique (row, id) pairs: deterministic
    return loss, grad.to(dtype)


def _chunk_fused(
    logits: torch.Tensor, ys: torch.Tensor, vocab: int, scale: float, want_grad: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Under torch.compile: the same values written as pure functions, so Inductor fuses them into a reduction
    that reads the logits (log-sum-exp in fp32) and one pointwise kernel that reads them again and writes the
    gradient in ``dtype``: no fp32 copy of the chunk in memory, no index_put (the onehot is a comparison)."""
    cols = torch.arange(logits.shape[1], device=logits.device)
    x = logits.float()
    if logits.shape[1] > vocab:
        x = x.masked_fill(cols >= vocab, float("-inf"))
    top = x.amax(dim=1, keepdim=True)
    lse = top + (x - top).exp().sum(dim=1, keepdim=True).log()  # (n, 1)
    loss = (lse.squeeze(1) - x.gather(1, ys[:, None]).squeeze(1)).sum()
    if not want_grad:
        return loss, None
    onehot = cols[None, :] == ys[:, None]
    grad = ((x - lse).exp() - onehot.to(x.dtype)) * scale
    return loss, grad.to(dtype)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, plan: tuple[int, int, torch.dtype, bool]
    ) -> torch.Tensor:
        # h (N, C); weight (Vp, C); targets (N,) int64 in [0, vocab); plan: (vocab, chunk, dtype, want_grad)
        vocab, chunk, dtype, want_grad = plan
        n_tokens = h.shape[0]
        per_chunk = _chunk_fused if _is_compiling() else _chunk_in_place
        with torch.autocast(device_type=h.device.type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            dh = torch.empty(hc.shape if want_grad else (0,), dtype=h.dtype, device=h.device)
            dw = torch.zeros(weight.shape if want_grad else (0,), dtype=torch.float32, device=weight.device)
            for start in range(0, n_tokens, chunk):
                stop = min(start + chunk, n_tokens)
                hs, ys = hc[start:stop], targets[start:stop]
                loss, grad = per_chunk(hs @ wc.t(), ys, vocab, 1.0 / n_tokens, want_grad, dtype)
                total = total + loss
                if grad is not None:
                    dh[start:stop] = (grad @ wc).to(h.dtype)
                    dw += (grad.t() @ hs).float()
        if want_grad:
            ctx.save_for_backward(dh, dw.to(weight.dtype))
        return total / n_tokens

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        dh, dw = ctx.saved_tensors
        return dh * grad_loss.to(dh.dtype), dw * grad_loss.to(dw.dtype), None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int, chunk_tokens: int = 4096
) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight[:vocab].T`` against ``targets``: h (..., C), weight (Vp ≥ vocab, C),
    targets (...) with ids in [0, vocab). Equal to ``F.cross_entropy`` on the logits up to rounding."""
    h2 = h.reshape(-1, h.shape[-1])
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    plan = (vocab, max(1, chunk_tokens), _compute_dtype(h), want_grad)
    return _LinearCrossEntropy.apply(h2, weight, targets.reshape(-1), plan)
