"""Small file and process helpers shared by every writer: hashing, fsync of directories, atomic text writes, a
finished folder renamed into place, whether a process is alive, and ``inside``: the check of every path read from
a bucket or a peer before anything is written there."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
from pathlib import Path

from .errors import X1Error


class OutsideFolder(X1Error):
    """A path read from outside this machine (a bucket key, a manifest, a peer rank's listing) that would land
    outside the folder it is meant for."""


def inside(root: Path, rel: object, what: str = "a path", fix: str = "it was not written by x1") -> Path:
    """``root / rel`` for a relative posix path read from an untrusted source, or OutsideFolder (exit 2) naming
    it: refused when empty, absolute, holding ``..``/``.``/empty parts, a backslash or a NUL, or when a symlink
    in an existing parent would take it outside ``root``. The one check every pull makes before it writes."""
    if (
        not isinstance(rel, str)
        or not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or any(part in ("", ".", "..") for part in rel.split("/"))
    ):
        raise OutsideFolder(
            f"{what} {rel!r} would be written outside its folder {root}: {fix}; nothing was written for it"
        )
    base = root.resolve()
    target = (base / rel).resolve()  # follows the symlinks of the parents that exist
    if target == base or not target.is_relative_to(base):
        raise OutsideFolder(
            f"{what} {rel!r} would be written outside its folder {root} (through the symlink "
            f"{target}): {fix}; nothing was written for it"
        )
    return base / rel


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
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fsync_dir(directory)


def write_text_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write to a hidden temporary name, fsync, rename into place, fsync the directory. ``mode`` (e.g. 0o600):
    the file's permissions from its creation on (default: the umask's)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with (
            open(tmp, "w")
            if mode is None
            else os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f
        ):
            if mode is not None:
                os.fchmod(f.fileno(), mode)
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


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
DISK_FULL_WORDS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT), "database or disk is full")


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a full disk (or quota): an OSError with ENOSPC/EDQUOT, or an error whose text says so
    (sqlite's "database or disk is full", an error that wraps the OSError)."""
    if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
        return True
    return says_disk_full(str(e))


def says_disk_full(text: str) -> bool:
    return any(w in text for w in DISK_FULL_WORDS)


def free_bytes(path: Path) -> int | None:
    """Bytes a writer may still use on the filesystem of ``path`` (or of its nearest existing parent), or None
    when that cannot be read."""
    for p in (path, *path.absolute().parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def dir_bytes(path: Path) -> int:
    """The size of the regular files directly in ``path`` (0 when it cannot be read)."""
    try:
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    except OSError:
        return 0


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
