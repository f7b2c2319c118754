"""The checkpoint cache directory, used without following links.

The directory is opened once and checked on that descriptor: owned by you (or root) and writable by nobody
else. A sticky bit is not enough: it stops others deleting your files, not planting ``<file>.part`` as a link
before your first download writes through it. Every file is then named relative to the descriptor and opened
with ``O_NOFOLLOW``; new files are written under a fresh name (``O_CREAT | O_EXCL``) and renamed into place,
which replaces a link instead of writing through it. A link or other non-file where the cache keeps its own
files is refused with its name.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO


class CacheError(ValueError):
    """The cache directory or one of its files cannot be used safely (the message names the fix)."""


class CacheDir:
    """One open cache directory; file names are plain names inside it."""

    def __init__(self, root: Path, create: bool = True) -> None:
        self.root = root
        if create:
            try:
                root.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as e:
                raise CacheError(f"cache directory {root} cannot be created ({e.strerror or e}); set IRPE_CACHE "
                                 "to a directory you can write") from None
        try:  # the directory itself may be a link (IRPE_CACHE -> a bigger disk): checked once opened
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise CacheError(f"cache directory {root} cannot be opened ({e.strerror or e}); set IRPE_CACHE") from None
        try:
            _check_owner_and_mode(root, os.fstat(self.fd))
        except CacheError:
            os.close(self.fd)
            raise

    def __enter__(self) -> CacheDir:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def is_file(self, name: str) -> bool:
        """True for a regular file, False when absent; CacheError for a link or anything else."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise CacheError(f"{self.root / name}: {kind} where the cache keeps its own file; the cache never "
                             "follows links: remove it")
        return True

    def size(self, name: str) -> int:
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size if self.is_file(name) else 0

    def open(self, name: str, flags: int, mode: int = 0o644) -> BinaryIO:
        """``os.open`` relative to the directory, never through a link (CacheError naming it): read-only,
        ``O_APPEND`` or write-only (an existing file must be a regular one: no FIFO to block on)."""
        if not flags & os.O_CREAT:
            self.is_file(name)
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                self.is_file(name)  # raises, naming the link
            raise
        return os.fdopen(fd, "ab" if flags & os.O_APPEND else "wb" if flags & os.O_WRONLY else "rb")

    def read_text(self, name: str) -> str | None:
        """The text of ``name``, None when absent."""
        if not self.is_file(name):
            return None
        with self.open(name, os.O_RDONLY) as f:
            return f.read(1 << 16).decode("utf-8", "replace")

    def sha256(self, name: str) -> str:
        h = hashlib.sha256()
        with self.open(name, os.O_RDONLY) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()

    def create(self, name: str) -> BinaryIO:
        """``name`` as a new empty file open for writing (whatever was there, link or file, is removed first)."""
        self.unlink(name)
        return self.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def write_text(self, name: str, text: str) -> None:
        """Replace ``name`` atomically: written under a fresh temporary name, then renamed over it."""
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            with self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) as f:
                f.write(text.encode())
            self.replace(tmp, name)
        finally:
            self.unlink(tmp)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass


def _check_owner_and_mode(root: Path, st: os.stat_result) -> None:
    if st.st_uid not in (os.geteuid(), 0):
        raise CacheError(f"cache directory {root} belongs to uid {st.st_uid}, not you: its owner could plant "
                         "links or files the download would use; set IRPE_CACHE to a directory of your own")
    if st.st_mode & 0o022:
        raise CacheError(f"cache directory {root} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"anyone there could plant links or files the download would use; chmod go-w {root} or "
                         "set IRPE_CACHE to a directory only you can write")
