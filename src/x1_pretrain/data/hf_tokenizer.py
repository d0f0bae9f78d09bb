"""Any Hugging Face ``tokenizers`` file (``tokenizer.json``), and a byte-level BPE trained offline on the input.

A byte-level BPE whose ids follow its merges (GPT-2's own, and every BPE trained here) is run through tiktoken,
which encodes the same ids several times faster; it is checked against ``tokenizers`` on a sample text when it is
loaded and falls back to ``tokenizers`` where they would differ. Any other model (WordPiece, Unigram, a BPE with
its own normaliser) runs through ``tokenizers`` itself.

Text is always encoded as ordinary text: a special token's string inside a document (``<|endoftext|>`` in a web
page about GPT-2) gives its ordinary pieces, never the special id; the document separator is added by the
pipeline, not found in the text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import DataError
from .gpt2_files import bytes_to_unicode
from .tokenizer import EOT_TEXT, GPT2_PATTERN, tiktoken_array

# a sample for the fast path's check: letters, digits, punctuation, runs of spaces, non-ASCII, a special's text
_CHECK_TEXT = (
    "Hello world!  It's 2026: x1 trains   BPE tokenizers.\n\n\tnaïve café, Ünïcödé 日本語 😀 -- 3.14159 "
    "don't we'll they've <|endoftext|> end\n"
)


@dataclass(frozen=True)
class FileTokenizer:
    """A loaded ``tokenizer.json`` and the id that separates documents."""

    hf: Any  # tokenizers.Tokenizer
    source: str
    file_sha256: str
    eot_id: int
    vocab_size: int
    fast: Any = field(default=None)  # a tiktoken.Encoding with the same ids, or None
    byte_level: bool = False  # a ByteLevel pre-tokenizer: each character of a piece stands for one byte
    name = "tokenizers"

    @property
    def eot_text(self) -> str:
        return str(self.hf.id_to_token(self.eot_id))

    def encode(self, text: str) -> list[int]:
        """Ordinary text to ids (special-token strings in the text are encoded as plain text)."""
        if self.fast is not None:
            return list(self.fast.encode_ordinary(text))
        return list(self.hf.encode(text, add_special_tokens=False).ids)

    def encode_array(self, text: str) -> np.ndarray:
        if self.fast is not None:
            return tiktoken_array(self.fast, text)
        return np.asarray(self.hf.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def decode(self, ids: list[int]) -> str:
        return str(self.hf.decode(list(ids), skip_special_tokens=False))

    def to_json(self) -> str:
        return str(self.hf.to_str())

    def token_bytes(self) -> np.ndarray:
        """The UTF-8 bytes each id stands for (0 for special tokens): bits per byte's denominator."""
        specials = {t.content for t in self.hf.get_added_tokens_decoder().values() if t.special}
        alphabet = set(bytes_to_unicode().values())
        out = np.zeros(self.vocab_size, np.int64)
        for i in range(self.vocab_size):
            piece = self.hf.id_to_token(i)
            if piece is None or piece in specials:
                continue
            if self.byte_level and all(c in alphabet for c in piece):
                out[i] = len(piece)
            else:
                out[i] = len(self.hf.decode([i]).encode("utf-8"))
        return out


def _byte_level(spec: dict[str, Any]) -> bool:
    pre = spec.get("pre_tokenizer") or {}
    kinds = [p.get("type") for p in pre.get("pretokenizers", [pre])] if pre else []
    return "ByteLevel" in kinds


def _fast_path(hf: Any, spec: dict[str, Any]) -> Any:
    """A tiktoken Encoding that gives ``hf``'s ids, or None where the model is not a plain byte-level BPE."""
    import tiktoken

    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    plain = (
        model.get("type") == "BPE"
        and not spec.get("normalizer")
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
        and not model.get("dropout")
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
    )
    if not plain:
        return None
    if any(not t.get("special") for t in spec.get("added_tokens", [])):
        return None  # tokenizers finds a non-special added token inside the text; tiktoken would not
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    added = {t["content"] for t in spec.get("added_tokens", [])}
    ranks: dict[bytes, int] = {}
    for piece, i in model.get("vocab", {}).items():
        if piece in added:
            continue
        if not all(c in inverse for c in piece):
            return None
        ranks[bytes(inverse[c] for c in piece)] = i
    if len(ranks) < 256 or any(bytes([b]) not in ranks for b in range(256)):
        return None
    # tiktoken merges the pair whose result has the lowest id; tokenizers the pair listed first: the same only
    # where the ids of the merged tokens rise with the merges' order
    merged = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        merged.append(model["vocab"].get(a + b, -1))
    if any(x < 0 for x in merged) or merged != sorted(merged):
        return None
    if len(set(merged)) != len(ranks) - 256:
        return None  # a vocab entry no merge makes: tokenizers never emits it, tiktoken would
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t["id"] not in ranks.values()}
    try:
        enc = tiktoken.Encoding(name="x1-file", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    except ValueError:
        return None
    sample = _CHECK_TEXT * 3
    if list(enc.encode_ordinary(sample)) != hf.encode(sample, add_special_tokens=False).ids:
        return None
    return enc


def from_json_text(text: str, source: str, eot_text: str = EOT_TEXT) -> FileTokenizer:
    """A tokenizer from its JSON (as ``tokenizer.json`` holds it); ``eot_text`` must be one of its tokens."""
    from tokenizers import Tokenizer as HF

    try:
        hf = HF.from_str(text)
        spec = json.loads(text)
    except Exception as e:  # tokenizers raises its own exception type for a malformed file
        raise DataError(
            f"{source}: not a Hugging Face tokenizers file ({type(e).__name__}: {str(e)[:200]}); give the "
            "tokenizer.json of a tokenizers/transformers tokenizer"
        ) from None
    hf.encode_special_tokens = True  # a special's string in a document is ordinary text
    eot = hf.token_to_id(eot_text)
    if eot is None:
        raise DataError(
            f"{source}: has no token {eot_text!r} to separate documents; name one with --eot-token "
            "(for example '</s>' or '<|end_of_text|>')"
        )
    vocab = int(hf.get_vocab_size(with_added_tokens=True))
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return FileTokenizer(hf, source, digest, int(eot), vocab, _fast_path(hf, spec), _byte_level(spec))


def load_tokenizer_json(path: Path, eot_text: str = EOT_TEXT) -> FileTokenizer:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"--tokenizer {path}: cannot be read ({e}); give a tokenizer.json file") from None
    return from_json_text(text, str(path), eot_text)


def train_bpe(
    texts: Iterable[str], vocab_size: int, eot_text: str = EOT_TEXT, show_progress: bool = False
) -> FileTokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer, every byte in the alphabet, ``eot_text`` as id 0) trained on
    ``texts``: the same input in the same order gives the same file."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise DataError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 257 (256 bytes + {eot_text})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(eot_text, special=True)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
        min_frequency=2,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return from_json_text(tok.to_str(), f"trained byte-level BPE, {vocab_size:,} ids", eot_text)


def spec(tok: Any) -> tuple[str, ...]:
    """What a worker process needs to build the same tokenizer (strings only: it pickles under spawn too)."""
    if tok.name == "gpt2":
        return ("gpt2", tok.source if tok.file_sha256 else "")
    return ("json", tok.to_json(), tok.source, tok.eot_text)


def from_spec(parts: tuple[str, ...]) -> Any:
    from .tokenizer import load_gpt2

    if parts[0] == "gpt2":
        return load_gpt2(parts[1] or None)
    return from_json_text(parts[1], parts[2], parts[3])


def of_data(directory: Path, meta: dict[str, Any]) -> Any:
    """The tokenizer that made a ``tokenize_data`` output (its ``tokenizer.json``; GPT-2's BPE for GPT-2 data,
    also where an output from before x1 wrote the file), checked against the sha256 its meta.json records."""
    from .tokenizer import load_gpt2

    if meta.get("tokenizer", "gpt2") == "gpt2":
        return load_gpt2()
    path = Path(directory) / str(meta.get("tokenizer_file") or "tokenizer.json")
    tok = load_tokenizer_json(path, str(meta.get("eot_token") or EOT_TEXT))
    want = meta.get("tokenizer_sha256")
    if want is not None and tok.file_sha256 != want:
        raise DataError(
            f"{path}: sha256 {tok.file_sha256} is not the {want} its meta.json records: the file was replaced "
            "after the bins were made; put the original back or re-tokenize"
        )
    return tok
