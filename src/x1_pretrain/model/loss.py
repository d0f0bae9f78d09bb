"""The LM head and its cross-entropy in one pass, without the (tokens × vocab) logits in memory.

The plain route, ``F.cross_entropy(lm_head(h).float(), y)``, keeps the logits (bf16), their fp32 copy, the
log-softmax and the gradient of each alive at once: at the lab's micro-batch (32 × 1024 tokens, 50,304
padded columns) that is 3.3 GB of bf16 logits plus 6.6 GB for every fp32 tensor of that shape.

Here the tokens are taken in chunks. For each chunk the forward computes the logits, the loss, and, since
the cross-entropy is the last operation of the graph, already the gradient ``softmax - onehot`` and what it
means for the hidden states and the head's weight (llm.c's fused classifier does the same in one kernel).
The backward then only scales those two saved gradients by the incoming scalar. Per chunk, one fp32
(chunk × vocab) buffer is reused in place (see the peak below); nothing of that size survives the forward.

Columns from ``vocab`` on (the padding of the head to a multiple of 128, see ``transformer.py``) get no
probability and no gradient. Under autocast the matmuls run in the autocast dtype, as ``nn.Linear`` would,
and the softmax and the loss in fp32. In no-grad mode (eval) the gradient work is skipped.

Peak per chunk: in fp32, the one (chunk × vocab) fp32 buffer (4 bytes an element). Under bf16 autocast more
lives for a moment: the matmul's bf16 logits beside their fp32 copy, and later the fp32 gradient beside its
bf16 cast for the two gradient matmuls, so 6 bytes an element at the peak, 1.5x the fp32 buffer (4096 ×
50,304 tokens × columns: 0.8 GB fp32, 1.2 GB at the peak).
"""

from __future__ import annotations

import torch


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would use for ``h`` here: the autocast dtype inside autocast, else h's own."""
    kind = h.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return h.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                plan: tuple[int, int, torch.dtype, bool]) -> torch.Tensor:
        # h (N, C); weight (Vp, C); targets (N,) int64 in [0, vocab); plan: (vocab, chunk, dtype, want_grad)
        vocab, chunk, dtype, want_grad = plan
        n_tokens = h.shape[0]
        with torch.autocast(device_type=h.device.type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            dh = torch.empty(hc.shape if want_grad else (0,), dtype=h.dtype, device=h.device)
            dw = torch.zeros(weight.shape if want_grad else (0,), dtype=torch.float32, device=weight.device)
            for start in range(0, n_tokens, chunk):
                stop = min(start + chunk, n_tokens)
                hs, ys = hc[start:stop], targets[start:stop]
                logits = (hs @ wc.t()).float()                           # (n, Vp), the only big buffer
                if logits.shape[1] > vocab:
                    logits[:, vocab:] = float("-inf")                    # padding: no probability
                picked = logits.gather(1, ys[:, None]).squeeze(1)        # (n,)
                # log-sum-exp in place (torch.logsumexp would allocate a second buffer of this size)
                top = logits.amax(dim=1)                                 # (n,)
                total_exp = logits.sub_(top[:, None]).exp_().sum(dim=1)  # logits now hold exp(logit - top)
                total = total + (top + total_exp.log() - picked).sum()
                if not want_grad:
                    continue
                # d(mean loss)/d(logits) = (softmax - onehot) / N, made in place in the same buffer
                grad = logits.div_(total_exp[:, None])
                rows = torch.arange(stop - start, device=h.device)
                grad[rows, ys] -= 1.0                                    # unique (row, id) pairs: deterministic
                grad = grad.mul_(1.0 / n_tokens).to(dtype)
                dh[start:stop] = (grad @ wc).to(h.dtype)
                dw += (grad.t() @ hs).float()
        if want_grad:
            ctx.save_for_backward(dh, dw.to(weight.dtype))
        return total / n_tokens

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        dh, dw = ctx.saved_tensors
        return dh * grad_loss.to(dh.dtype), dw * grad_loss.to(dw.dtype), None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int,
                         chunk_tokens: int = 4096) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight[:vocab].T`` against ``targets``: h (..., C), weight (Vp ≥ vocab, C),
    targets (...) with ids in [0, vocab). Equal to ``F.cross_entropy`` on the logits up to rounding."""
    h2 = h.reshape(-1, h.shape[-1])
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    plan = (vocab, max(1, chunk_tokens), _compute_dtype(h), want_grad)
    return _LinearCrossEntropy.apply(h2, weight, targets.reshape(-1), plan)
