"""Scores from log-likelihoods: every choice's continuation scored by the x1 Transformer in batches (longest
first, padded on the right, the LM head applied only where a continuation token is predicted), then ``acc`` and
``acc_norm`` per task.

Tokenisation follows lm-evaluation-harness 0.4's rule: spaces at the end of the context move to the start of
the continuation, the continuation's tokens are those of ``encode(context + continuation)`` after the
context's own tokens, and a pair longer than ``model.seq_len + 1`` tokens loses tokens from the left (counted
as ``truncated``). No token is added before the context: GPT-2's tokenizer adds none in the harness either.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .tasks import HAS_ACC_NORM, Item


@dataclass(frozen=True)
class TaskScore:
    task: str
    n: int                    # items scored
    acc: float
    acc_norm: float | None    # None where the harness reports none (WinoGrande)
    chance: float             # the mean of 1 / choices: what guessing scores
    truncated: int            # requests cut from the left to fit model.seq_len
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"acc": self.acc, "acc_norm": self.acc_norm, "n": self.n, "chance": self.chance,
                "truncated": self.truncated, "seconds": round(self.seconds, 3)}


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) as the harness splits them."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


class Scorer:
    """Summed log-likelihoods of continuations under ``model`` (an x1 Transformer, eval mode)."""

    def __init__(self, model: Any, encode: Callable[[str], list[int]], batch_size: int = 32,
                 bf16: bool = False, check: Callable[[], None] | None = None) -> None:
        self.model, self.encode, self.batch_size, self.bf16 = model, encode, max(1, batch_size), bf16
        self.check = check    # called before each batch; may raise to end the scoring (a deadline, a stop)
        self.seq_len = int(model.config.seq_len)
        self.vocab = int(model.config.vocab_size)

    def logliks(self, requests: Sequence[tuple[str, str]]) -> tuple[list[float], int]:
        """(one summed log-likelihood per request, in order; how many requests were truncated)."""
        rows: list[tuple[int, list[int], int]] = []    # (request index, input tokens, continuation length)
        truncated = 0
        for i, (context, continuation) in enumerate(requests):
            ctx, cont = encode_pair(self.encode, context, continuation)
            whole = ctx + cont
            if len(whole) > self.seq_len + 1:
                truncated += 1
                whole = whole[-(self.seq_len + 1):]
            rows.append((i, whole, min(len(cont), len(whole) - 1)))
        out = [0.0] * len(requests)
        rows.sort(key=lambda r: -len(r[1]))
        for start in range(0, len(rows), self.batch_size):
            if self.check is not None:
                self.check()
            for i, value in self._batch(rows[start:start + self.batch_size]):
                out[i] = value
        return out, truncated

    def _batch(self, rows: list[tuple[int, list[int], int]]) -> list[tuple[int, float]]:
        import torch

        device = next(self.model.parameters()).device
        width = max(len(w) - 1 for _, w, _ in rows)
        x = torch.zeros((len(rows), width), dtype=torch.long)
        picks: list[int] = []
        targets: list[int] = []
        owner: list[int] = []
        for r, (_, whole, n_cont) in enumerate(rows):
            inp = whole[:-1]
            x[r, :len(inp)] = torch.tensor(inp)
            first = len(inp) - n_cont           # the position whose logits predict the first continuation token
            picks.extend(r * width + p for p in range(first, len(inp)))
            targets.extend(whole[first + 1:])
            owner.extend([r] * n_cont)
        autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if self.bf16 \
            else contextlib.nullcontext()
        with torch.inference_mode(), autocast:
            h = self.model.hidden(x.to(device))
            h = h.reshape(-1, h.shape[-1])[torch.tensor(picks, device=device)]
            logits = h @ self.model.lm_head.weight[:self.vocab].t()
        logp = torch.log_softmax(logits.float(), dim=-1)
        token_lp = logp.gather(1, torch.tensor(targets, device=device).unsqueeze(1)).squeeze(1).double()
        sums = torch.zeros(len(rows), dtype=torch.float64, device=device)
        sums.index_add_(0, torch.tensor(owner, device=device), token_lp)
        return [(i, float(s)) for (i, _, _), s in zip(rows, sums.tolist(), strict=True)]


def _argmax(values: Sequence[float]) -> int:
    """The first index of the largest value (numpy's argmax, which the harness uses)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def score(task: str, items: list[Item], scorer: Scorer) -> TaskScore:
    t0 = time.monotonic()
    lls, truncated = scorer.logliks([r for it in items for r in it.requests])
    hits = hits_norm = 0
    at = 0
    for it in items:
        vals = lls[at:at + it.n_choices]
        at += it.n_choices
        hits += _argmax(vals) == it.gold
        hits_norm += _argmax([v / c for v, c in zip(vals, it.choice_chars, strict=True)]) == it.gold
    n = len(items)
    chance = sum(1 / it.n_choices for it in items) / n if n else math.nan
    return TaskScore(task, n, hits / n if n else math.nan,
                     (hits_norm / n if n else math.nan) if HAS_ACC_NORM[task] else None,
                     chance, truncated, time.monotonic() - t0)
