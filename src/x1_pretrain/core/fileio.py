"""Small file and process helpers shared by every writer: hashing, fsync of directories, atomic text writes, a
finished folder renamed into place, whether a process is alive."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: Path) -> None:
    """fsync every file directly in ``directory``, then the directory itself (before renaming it)."""
    for p in directory.iterdir():
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(directory)


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a hidden temporary name, fsync, rename into place, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write failed
    fsync_dir(path.parent)


def replace_dir(tmp: Path, final: Path) -> None:
    """Rename the finished folder ``tmp`` to ``final``. An existing ``final`` is moved aside first and removed
    only after the rename, so at every moment one complete folder carries the name (or none did before)."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
