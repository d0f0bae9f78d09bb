"""Scores from log-likelihoods: every choice's continuation scored by the x1 Transformer in batches (longest
first, padded on the right, an item's context run once for all its endings, the LM head applied only where a
continuation token is predicted), then ``acc`` and ``acc_norm`` per task.

Tokenisation follows lm-evaluation-harness 0.4's rule: spaces at the end of the context move to the start of
the continuation, the continuation's tokens are those of ``encode(context + continuation)`` after the
context's own tokens, and a pair longer than ``model.seq_len + 1`` tokens loses tokens from the left (counted
as ``truncated``). No token is added before the context: GPT-2's tokenizer adds none in the harness either.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .registry import TASKS
from .tasks import Item


@dataclass(frozen=True)
class TaskScore:
    task: str
    n: int  # items scored
    acc: float
    acc_norm: float | None  # None where the harness reports none (WinoGrande)
    chance: float  # the mean of 1 / choices: what guessing scores
    truncated: int  # requests whose context was cut from the left to fit model.seq_len
    seconds: float
    skipped: int = 0  # items left out: a continuation alone longer than model.seq_len (the harness refuses)

    def to_json(self) -> dict[str, Any]:
        return {
            "acc": self.acc,
            "acc_norm": self.acc_norm,
            "n": self.n,
            "chance": self.chance,
            "truncated": self.truncated,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 3),
        }


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context tokens, continuation tokens) as the harness splits them."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx) :]


@dataclass
class _Row:
    """One row of a batch: its input tokens and, per request it scores, where the predictions of that request's
    continuation tokens sit and what they are. A packed row holds one context and several continuations, each
    seeing only the context and itself (``segments``: 0 for the context, j + 1 for continuation j), with the
    positions the context ends at (``positions``); a plain row is one causal sequence (both None)."""

    tokens: list[int]
    scored: list[tuple[int, list[int], list[int]]]  # (request index, positions in the row, target tokens)
    positions: list[int] | None = None
    segments: list[int] | None = None


def _plain_row(i: int, whole: list[int], n_cont: int) -> _Row:
    inp = whole[:-1]
    first = len(inp) - n_cont  # the position whose logits predict the first continuation token
    return _Row(inp, [(i, list(range(first, len(inp))), whole[first + 1 :])])


def _packed_row(ctx: list[int], conts: list[tuple[int, list[int]]]) -> _Row:
    """``ctx`` once, then each continuation but its last token; the last context token predicts every
    continuation's first token."""
    tokens, positions, segments = list(ctx), list(range(len(ctx))), [0] * len(ctx)
    scored = []
    for j, (i, cont) in enumerate(conts):
        at = len(tokens)
        tokens += cont[:-1]
        positions += range(len(ctx), len(ctx) + len(cont) - 1)
        segments += [j + 1] * (len(cont) - 1)
        scored.append((i, [len(ctx) - 1, *range(at, at + len(cont) - 1)], cont))
    return _Row(tokens, scored, positions, segments)


class Scorer:
    """Summed log-likelihoods of continuations under ``model`` (an x1 Transformer, eval mode).

    ``share_context``: the requests with the same context (an item's endings) are packed into one row, the
    context run once and each ending attending to it and to itself only (positions restart after the
    context), where the row fits ``model.seq_len`` untruncated; the log-likelihoods are those of separate
    rows up to float rounding. Off, or for a model without ``hidden(idx, positions, mask)``, one row per
    request."""

    def __init__(
        self,
        model: Any,
        encode: Callable[[str], list[int]],
        batch_size: int = 32,
        bf16: bool = False,
        check: Callable[[], None] | None = None,
        share_context: bool = True,
    ) -> None:
        self.model, self.encode, self.batch_size, self.bf16 = model, encode, max(1, batch_size), bf16
        self.check = check  # called before each batch; may raise to end the scoring (a deadline, a stop)
        self.seq_len = int(model.config.seq_len)
        self.vocab = int(model.config.vocab_size)
        self.share_context = share_context and "positions" in inspect.signature(model.hidden).parameters
        self.skipped: set[int] = set()  # of the last logliks call: requests whose continuation exceeds seq_len

    def _rows(self, requests: Sequence[tuple[str, str]]) -> tuple[list[_Row], int]:
        self.skipped = set()
        groups: dict[str, list[int]] = {}
        for i, (context, _) in enumerate(requests):
            groups.setdefault(context, []).append(i)
        rows: list[_Row] = []
        truncated = 0
        for members in groups.values():
            pairs = [(i, *encode_pair(self.encode, *requests[i])) for i in members]
            # every member's context tokens are the same (one context string); their continuations may differ
            ctx = pairs[0][1]
            packed = len(ctx) + sum(len(cont) - 1 for _, _, cont in pairs)
            if (
                self.share_context
                and len(pairs) > 1
                and ctx
                and packed <= self.seq_len
                and all(cont for _, _, cont in pairs)
            ):
                rows.append(_packed_row(ctx, [(i, cont) for i, _, cont in pairs]))
                continue
            for i, c, cont in pairs:
                if len(cont) > self.seq_len:
                    self.skipped.add(i)  # no prediction of its first tokens is possible: NaN, the item skipped
                    continue
                whole = c + cont
                if len(whole) > self.seq_len + 1:
                    truncated += 1
                    whole = whole[-(self.seq_len + 1) :]
                rows.append(_plain_row(i, whole, min(len(cont), len(whole) - 1)))
        return rows, truncated

    def logliks(self, requests: Sequence[tuple[str, str]]) -> tuple[list[float], int]:
        """(one summed log-likelihood per request, in order; how many requests were truncated). A request whose
        continuation alone is longer than ``model.seq_len`` gets NaN: it cannot be scored whole (the harness
        refuses it too), and cutting the continuation would score another text."""
        rows, truncated = self._rows(requests)
        out = [math.nan] * len(requests)
        rows.sort(key=lambda r: -len(r.tokens))
        for start in range(0, len(rows), self.batch_size):
            if self.check is not None:
                self.check()
            for i, value in self._batch(rows[start : start + self.batch_size]):
                out[i] = value
        return out, truncated

    def _batch(self, rows: list[_Row]) -> list[tuple[int, float]]:
        import torch

        device = next(self.model.parameters()).device
        width = max(len(r.tokens) for r in rows)
        x = torch.zeros((len(rows), width), dtype=torch.long)
        picks: list[int] = []
        targets: list[int] = []
        owner: list[int] = []
        requests: list[int] = []
        for r, row in enumerate(rows):
            x[r, : len(row.tokens)] = torch.tensor(row.tokens)
            for i, at, cont in row.scored:
                picks.extend(r * width + p for p in at)
                targets.extend(cont)
                owner.extend([len(requests)] * len(cont))
                requests.append(i)
        extra = _packing(rows, width, device) if any(r.positions is not None for r in rows) else {}
        autocast = (
            torch.autocast(device_type=device.type, dtype=torch.bfloat16) if self.bf16 else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            h = self.model.hidden(x.to(device), **extra)
            h = h.reshape(-1, h.shape[-1])[torch.tensor(picks, device=device)]
            logits = h @ self.model.lm_head.weight[: self.vocab].t()
        logp = torch.log_softmax(logits.float(), dim=-1)
        token_lp = logp.gather(1, torch.tensor(targets, device=device).unsqueeze(1)).squeeze(1).double()
        sums = torch.zeros(len(requests), dtype=torch.float64, device=device)
        sums.index_add_(0, torch.tensor(owner, device=device), token_lp)
        return list(zip(requests, sums.tolist(), strict=True))


def _packing(rows: list[_Row], width: int, device: Any) -> dict[str, Any]:
    """The positions (B, T) and the attention mask (B, 1, T, T) of a batch with packed rows: a token sees the
    keys at or before it in its own segment or in the context (segment 0); padding sees only itself."""
    import torch

    pos = torch.zeros((len(rows), width), dtype=torch.long)
    seg = torch.full((len(rows), width), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        n = len(row.tokens)
        pos[r, :n] = torch.tensor(row.positions if row.positions is not None else range(n))
        seg[r, :n] = torch.tensor(row.segments) if row.segments is not None else 0
    q, k = seg[:, :, None], seg[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    visible = causal & (q >= 0) & ((k == 0) | (k == q))
    mask = visible | torch.eye(width, dtype=torch.bool)
    return {"positions": pos.to(device), "mask": mask[:, None].to(device)}


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
    hits = hits_norm = n = 0
    chance = 0.0
    at = 0
    for it in items:
        vals = lls[at : at + it.n_choices]
        if any(i in scorer.skipped for i in range(at, at + it.n_choices)):
            at += it.n_choices
            continue
        at += it.n_choices
        n += 1
        chance += 1 / it.n_choices
        hits += _argmax(vals) == it.gold
        hits_norm += _argmax([v / c for v, c in zip(vals, it.choice_chars, strict=True)]) == it.gold
    return TaskScore(
        task,
        n,
        hits / n if n else math.nan,
        (hits_norm / n if n else math.nan) if "acc_norm" in TASKS[task].metrics else None,
        chance / n if n else math.nan,
        truncated,
        time.monotonic() - t0,
        len(items) - n,
    )
