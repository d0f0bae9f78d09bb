"""Reading raw web-text shards as a stream of documents, with errors that name file and line.

Formats: ``*.parquet`` (a text column), ``*.jsonl`` / ``*.jsonl.gz`` / ``*.jsonl.zst`` (a ``"text"`` key
per line) and ``*.txt`` (one document per file). Nothing is ever read whole into memory except a
single ``.txt`` document.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..core.errors import DataError

SUFFIXES = (".parquet", ".jsonl", ".jsonl.zst", ".jsonl.gz", ".txt")
_READ_BLOCK = 1 << 20


class BadShard(DataError):
    """A shard that cannot be read as documents; ``where`` is the file and, when known, line or row."""

    def __init__(self, path: Path, where: str, problem: str, hint: str = "") -> None:
        self.path = path
        self.where = where
        self.problem = problem
        loc = f"{path}{where}"
        tail = f"\n  hint: {hint}" if hint else "\n  hint: fix or remove the file, or pass --skip-bad-files"
        super().__init__(f"{loc}: {problem}{tail}")


def shard_kind(path: Path) -> str | None:
    name = path.name
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return suffix
    return None


def discover(input_dir: Path) -> list[Path]:
    """Every supported shard under ``input_dir``, recursively, in sorted (deterministic) order."""
    if not input_dir.is_dir():
        raise DataError(f"--input-dir {input_dir} is not a directory")
    found = [
        p
        for p in input_dir.rglob("*")
        if p.is_file() and shard_kind(p) and not any(part.startswith(".") for part in p.relative_to(input_dir).parts)
    ]
    found.sort(key=lambda p: p.relative_to(input_dir).as_posix())
    if not found:
        raise DataError(
            f"--input-dir {input_dir} holds no input shards ({', '.join('*' + s for s in SUFFIXES)})",
        )
    return found


@dataclass
class Progress:
    """How far through the current shard the reader is, as a fraction of the shard (for the ETA)."""

    fraction: float = 0.0


def _decode(raw: bytes, path: Path, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadShard(path, where, f"invalid UTF-8 at byte {e.start} of the text") from None


class _ZstdLines:
    """Binary reader over a (possibly multi-frame) zstd file that notices truncation.

    python-zstandard's stream reader returns a short read on a truncated file instead of failing,
    so frames are decoded by hand and an unfinished frame at end of file is an error.
    """

    def __init__(self, raw: BinaryIO, path: Path) -> None:
        import zstandard

        self._raw = raw
        self._path = path
        self._dctx = zstandard.ZstdDecompressor()
        self._error = zstandard.ZstdError

    def blocks(self) -> Iterator[bytes]:
        obj = self._dctx.decompressobj()
        in_frame = False
        while block := self._raw.read(_READ_BLOCK):
            while block:
                try:
                    out = obj.decompress(block)
                except self._error as e:
                    raise BadShard(self._path, "", f"corrupt zstd data ({e})") from None
                in_frame = True
                if out:
                    yield out
                if obj.eof:
                    block = obj.unused_data
                    obj = self._dctx.decompressobj()
                    in_frame = False
                else:
                    block = b""
        if in_frame:
            raise BadShard(
                self._path,
                "",
                "truncated zstd stream (the file ends inside a frame)",
                "re-download the shard; it was cut short",
            )


def _lines(blocks: Iterator[bytes]) -> Iterator[bytes]:
    rest = b""
    for block in blocks:
        parts = (rest + block).split(b"\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def _jsonl_docs(path: Path, kind: str, text_key: str, progress: Progress) -> Iterator[str]:
    size = max(path.stat().st_size, 1)
    with open(path, "rb") as raw:
        if kind == ".jsonl.zst":
            blocks: Iterator[bytes] = _ZstdLines(raw, path).blocks()
        elif kind == ".jsonl.gz":
            blocks = _gzip_blocks(raw, path)
        else:
            blocks = iter(lambda: raw.read(_READ_BLOCK), b"")
        for lineno, line in enumerate(_lines(blocks), start=1):
            progress.fraction = min(raw.tell() / size, 1.0)
            if not line.strip():
                continue
            where = f":{lineno}"
            text = _decode(line, path, where)
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise BadShard(path, where, f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict) or text_key not in obj:
                raise BadShard(
                    path,
                    where,
                    f"JSON line has no {text_key!r} key",
                    f"each line must be an object with a {text_key!r} string (--text-column)",
                )
            value = obj[text_key]
            if not isinstance(value, str):
                raise BadShard(path, where, f"{text_key!r} is {type(value).__name__}, expected a string")
            yield value


def _gzip_blocks(raw: BinaryIO, path: Path) -> Iterator[bytes]:
    try:
        with gzip.GzipFile(fileobj=raw) as gz:
            while block := gz.read(_READ_BLOCK):
                yield block
    except (OSError, EOFError, zlib.error) as e:
        raise BadShard(path, "", f"corrupt or truncated gzip data ({e})") from None


def _parquet_docs(path: Path, column: str, progress: Progress) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise BadShard(path, "", f"not a readable parquet file ({e})") from None
    names = pf.schema_arrow.names
    if column not in names:
        raise BadShard(
            path, "", f"no column {column!r} (columns: {', '.join(names)})", "name the text column with --text-column"
        )
    row = 0
    n_groups = max(pf.num_row_groups, 1)
    for g in range(pf.num_row_groups):
        try:
            table = pf.read_row_group(g, columns=[column])
        except (pa.ArrowException, OSError) as e:
            raise BadShard(path, f" row group {g}", f"cannot be read ({e})") from None
        col = table.column(0)
        if not (
            pa.types.is_string(col.type)
            or pa.types.is_large_string(col.type)
            or pa.types.is_binary(col.type)
            or pa.types.is_large_binary(col.type)
        ):
            raise BadShard(path, "", f"column {column!r} has type {col.type}, expected strings")
        # Decode ourselves from bytes, so invalid UTF-8 is reported with its row number.
        as_bytes = col.cast(pa.large_binary())
        for chunk in as_bytes.chunks:
            for value in chunk.to_pylist():
                where = f" row {row}"
                row += 1
                yield "" if value is None else _decode(value, path, where)
        progress.fraction = (g + 1) / n_groups


def iter_documents(path: Path, text_key: str = "text", progress: Progress | None = None) -> Iterator[str]:
    """The documents of one shard, in file order. Raises :class:`BadShard` naming file and line/row."""
    progress = progress or Progress()
    progress.fraction = 0.0
    kind = shard_kind(path)
    try:
        if kind == ".parquet":
            yield from _parquet_docs(path, text_key, progress)
        elif kind in (".jsonl", ".jsonl.gz", ".jsonl.zst"):
            yield from _jsonl_docs(path, kind, text_key, progress)
        elif kind == ".txt":
            yield _decode(path.read_bytes(), path, "")
            progress.fraction = 1.0
        else:
            raise BadShard(path, "", "unsupported file type", f"supported: {', '.join(SUFFIXES)}")
    except PermissionError as e:
        raise BadShard(path, "", f"cannot be opened ({e.strerror})", "check the file's permissions") from None
