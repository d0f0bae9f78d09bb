"""The exact GPT-2 BPE through tiktoken from a local, hash-checked ``gpt2.tiktoken`` (lookup: explicit
path, ``$X1_TOKENIZER_FILE``, the cache, tiktoken's own), and filling the cache from PyPI's whisper sdist
(the ``tokenizer fetch`` command)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..core.errors import TokenizerNotFound
from ..core.fileio import sha256_file

if TYPE_CHECKING:
    import tiktoken

GPT2_TIKTOKEN_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_TIKTOKEN_BYTES = 835_554  # its size: a member of another size is refused before it is read
GPT2_VOCAB_SIZE = 50257
EOT_ID = 50256
EOT_TEXT = "<|endoftext|>"
# GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols, whitespace.
# Possessive quantifiers as tiktoken uses them (same splits as the original regex, faster).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
TOKENIZER_ENV = "X1_TOKENIZER_FILE"
CACHE_ENV = "X1_CACHE_DIR"
WHISPER_SDIST = "openai-whisper==20250625"
WHISPER_MEMBER = "whisper/assets/gpt2.tiktoken"

HOW_TO_PROVIDE = (
    "Provide the GPT-2 BPE ranks file gpt2.tiktoken (sha256 " + GPT2_TIKTOKEN_SHA256[:16] + "…) by one of:\n"
    "  * python -m x1_pretrain.tokenizer fetch   (takes it from PyPI's openai-whisper sdist; make does this)\n"
    "  * --tokenizer-file /path/to/gpt2.tiktoken\n"
    f"  * export {TOKENIZER_ENV}=/path/to/gpt2.tiktoken"
)


def cache_dir() -> Path:
    """The project's cache directory (created on demand by ``fetch``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "x1_pretrain"


def cached_file() -> Path:
    return cache_dir() / "gpt2.tiktoken"


@dataclass(frozen=True)
class Tokenizer:
    """A loaded GPT-2 tokenizer and where it came from (recorded in meta.json)."""

    encoding: tiktoken.Encoding
    source: str
    file_sha256: str | None

    name = "gpt2"
    vocab_size = GPT2_VOCAB_SIZE
    eot_id = EOT_ID
    eot_text = EOT_TEXT

    def encode(self, text: str) -> list[int]:
        """Ordinary text to ids: special-token strings in the text are encoded as plain text."""
        return self.encoding.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)

    def encode_array(self, text: str) -> np.ndarray:
        """``encode`` as a uint32 array (no list of Python ints on the way)."""
        return tiktoken_array(self.encoding, text)

    def to_json(self) -> str:
        """The same BPE as a Hugging Face ``tokenizer.json`` (vocab and merges rebuilt from the ranks)."""
        from .gpt2_files import hf_tokenizer_json

        return hf_tokenizer_json(self)

    def token_bytes(self) -> np.ndarray:
        """The UTF-8 bytes each id stands for (0 for the end-of-text token): bits per byte's denominator."""
        out = np.array([len(self.encoding.decode_single_token_bytes(i)) for i in range(self.vocab_size)], np.int64)
        out[self.eot_id] = 0
        return out


def tiktoken_array(enc: tiktoken.Encoding, text: str) -> np.ndarray:
    """Ordinary text to a uint32 id array. encode_to_numpy skips the list-of-ints round trip; with no allowed
    special tokens it is encode_ordinary (a literal "<|endoftext|>" in a document is ordinary text). Older tiktoken
    lacks it."""
    if hasattr(enc, "encode_to_numpy"):
        return np.asarray(enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=()), dtype=np.uint32)
    return np.asarray(enc.encode_ordinary(text), dtype=np.uint32)


def _candidates(explicit: str | os.PathLike[str] | None) -> list[tuple[str, Path]]:
    out: list[tuple[str, Path]] = []
    if explicit:
        out.append(("--tokenizer-file", Path(explicit).expanduser()))
    env = os.environ.get(TOKENIZER_ENV)
    if env:
        out.append((TOKENIZER_ENV, Path(env).expanduser()))
    out.append(("cache", cached_file()))
    return out


def _encoding_from_file(path: Path) -> tiktoken.Encoding:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: EOT_ID},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


def load_gpt2(tokenizer_file: str | os.PathLike[str] | None = None, allow_download: bool = True) -> Tokenizer:
    """Load the exact GPT-2 BPE. See the module docstring for the lookup order."""
    problems: list[str] = []
    for origin, path in _candidates(tokenizer_file):
        if not path.is_file():
            if origin != "cache":
                problems.append(f"{origin}: {path} does not exist")
            continue
        digest = sha256_file(path)
        if digest != GPT2_TIKTOKEN_SHA256:
            problems.append(f"{origin}: {path} has sha256 {digest}, expected {GPT2_TIKTOKEN_SHA256}")
            continue
        return Tokenizer(_encoding_from_file(path), source=str(path), file_sha256=digest)
    if allow_download:
        try:
            import tiktoken

            enc = tiktoken.get_encoding("gpt2")
            return Tokenizer(enc, source="tiktoken.get_encoding('gpt2')", file_sha256=None)
        except Exception as e:  # network errors come in many types; all mean "not available"
            problems.append(f"tiktoken's own download failed ({type(e).__name__})")
    detail = "".join(f"\n  - {p}" for p in problems)
    raise TokenizerNotFound(f"GPT-2 tokenizer not found.{detail}\n{HOW_TO_PROVIDE}")


def _read_member(archive: Path) -> bytes:
    """``gpt2.tiktoken``'s bytes from the sdist: only a regular file of the known size is read (a link, a device
    or a member of another size is refused by name before anything is read)."""
    with tarfile.open(archive, "r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(WHISPER_MEMBER)), None)
        if member is None:
            raise TokenizerNotFound(f"{archive.name} has no {WHISPER_MEMBER}\n{HOW_TO_PROVIDE}")
        if not member.isreg():
            kind = "a symlink" if member.issym() else "a hard link" if member.islnk() else "not a regular file"
            raise TokenizerNotFound(
                f"{archive.name}: {member.name} is {kind}, not the file x1 expects; nothing was read\n{HOW_TO_PROVIDE}"
            )
        if member.size != GPT2_TIKTOKEN_BYTES:
            raise TokenizerNotFound(
                f"{archive.name}: {member.name} is {member.size:,} bytes, expected "
                f"{GPT2_TIKTOKEN_BYTES:,}; nothing was read\n{HOW_TO_PROVIDE}"
            )
        fobj = tar.extractfile(member)
        data = fobj.read(GPT2_TIKTOKEN_BYTES + 1) if fobj is not None else b""
    return data


def fetch_into_cache(dest: Path | None = None, pip: list[str] | None = None) -> Path:
    """Fill the cache from the openai-whisper sdist on PyPI (one file extracted, hash-checked)."""
    dest = dest or cached_file()
    if dest.is_file() and sha256_file(dest) == GPT2_TIKTOKEN_SHA256:
        return dest
    pip = pip or [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="x1-tok-") as tmp:
        cmd = [*pip, "download", "--quiet", "--no-deps", "--no-binary", ":all:", WHISPER_SDIST, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise TokenizerNotFound(
                f"could not download {WHISPER_SDIST} from the package registry:\n"
                f"{proc.stderr.strip()[-800:]}\n{HOW_TO_PROVIDE}"
            )
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise TokenizerNotFound(f"pip download of {WHISPER_SDIST} produced no sdist\n{HOW_TO_PROVIDE}")
        data = _read_member(archives[0])
    digest = hashlib.sha256(data).hexdigest()
    if digest != GPT2_TIKTOKEN_SHA256:
        raise TokenizerNotFound(f"{WHISPER_MEMBER} in the sdist has sha256 {digest}, expected {GPT2_TIKTOKEN_SHA256}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = dest.with_name(dest.name + f".tmp-{os.getpid()}")
    with open(tmp_path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp_path, dest)
    return dest
