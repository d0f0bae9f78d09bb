"""GPT-2's Hugging Face tokenizer files (``vocab.json``, ``merges.txt`` …) rebuilt from ``gpt2.tiktoken``.

tiktoken stores byte strings and their ranks; GPT-2's original files store the same tokens as
printable unicode strings (``bytes_to_unicode``: each byte maps to one character, space -> ``Ġ``) and
the merges as the pairs that produced each token. A token's merge pair is recovered by running BPE
on its bytes with only the merges ranked below it: what is left is exactly the two parts it was made
from. The result is byte-identical to OpenAI's ``encoder.json`` and ``vocab.bpe`` (tested where
``../shared/data/tokenizer`` holds them), so ``transformers.AutoTokenizer`` gives tiktoken's ids.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .tokenizer import EOT_ID, EOT_TEXT, GPT2_VOCAB_SIZE, Tokenizer

MERGES_HEADER = "#version: 0.2"


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> character map (printable bytes stay themselves, others shift past 255)."""
    keep = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    out = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + n)
            n += 1
    return out


def _text(token: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[b] for b in token)


def _merge_pair(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two tokens that BPE merged into ``token``: BPE over its bytes using only lower-ranked merges."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best: tuple[int, int] | None = None  # (rank, index)
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {limit}) is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def mergeable_ranks(tok: Tokenizer) -> dict[bytes, int]:
    """tiktoken's byte-string ranks (through its public API), without the special token."""
    enc = tok.encoding
    ranks = {b: enc.encode_single_token(b) for b in enc.token_byte_values()}
    if sorted(ranks.values()) != list(range(EOT_ID)):
        raise ValueError(f"expected the {EOT_ID} GPT-2 ranks 0..{EOT_ID - 1}, got {len(ranks)} tokens")
    return ranks


def vocab_and_merges(tok: Tokenizer) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(vocab: token text -> id, in id order, EOT last; merges in rank order)."""
    ranks = mergeable_ranks(tok)
    ordered = sorted(ranks, key=ranks.__getitem__)
    vocab = {_text(t): ranks[t] for t in ordered}
    vocab[EOT_TEXT] = EOT_ID
    merges = []
    for t in ordered:
        if len(t) > 1:
            a, b = _merge_pair(t, ranks)
            merges.append((_text(a), _text(b)))
    if len(vocab) != GPT2_VOCAB_SIZE:
        raise ValueError(f"rebuilt vocabulary has {len(vocab)} entries, expected {GPT2_VOCAB_SIZE}")
    return vocab, merges


def tokenizer_files(tok: Tokenizer, model_max_length: int) -> dict[str, str]:
    """File name -> content for a ``GPT2Tokenizer`` folder (slow or fast; no tokenizer.json needed)."""
    vocab, merges = vocab_and_merges(tok)
    special = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "model_max_length": model_max_length,
        "add_prefix_space": False,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,  # decode(encode(text)) == text, as tiktoken does
        "errors": "replace",
        **special,
    }
    return {
        # json.dumps defaults (ASCII escapes, ", " and ": ") reproduce OpenAI's encoder.json byte for byte
        "vocab.json": json.dumps(vocab),
        "merges.txt": "\n".join([MERGES_HEADER, *(f"{a} {b}" for a, b in merges)]) + "\n",
        "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special, indent=2) + "\n",
    }


def write_tokenizer_files(directory: Path, tok: Tokenizer, model_max_length: int) -> list[str]:
    """Write the files into ``directory`` (the caller makes the directory atomic); returns their names."""
    files = tokenizer_files(tok, model_max_length)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return sorted(files)


def hf_tokenizer_json(tok: Tokenizer) -> str:
    """GPT-2's BPE as a ``tokenizers`` file: byte-level, GPT-2's split, the end-of-text token special."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HF

    vocab, merges = vocab_and_merges(tok)
    hf = HF(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(EOT_TEXT, special=True)])
    return str(hf.to_str())
