"""Client system shared memory (Triton's ``system_shared_memory`` extension), protocol-neutral.

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers ``byte_size`` bytes of it from
``offset`` under a region name, and then names regions instead of sending tensor bytes. Every front end (HTTP,
gRPC) calls one :class:`SharedMemoryRegistry` per process.

Off unless ``--allow-client-shm``: a client that can name any file in ``/dev/shm`` could otherwise read or
overwrite other programs' shared memory. Even when on:

- keys are one plain name in ``/dev/shm`` (no ``/`` inside, no leading dot), opened relative to that folder
  without following links, and must be a regular file; this server's own segments (``psm_*``, ``irpe*``,
  Triton's) are refused;
- at most ``max_regions`` regions of at most ``max_bytes`` each, and the region must lie inside the file;
- reads and writes use ``pread``/``pwrite`` on the held descriptor, never a mapping: a file the client shrinks
  afterwards gives a short read (a clear error), not a SIGBUS, and nothing outside ``[offset, offset +
  byte_size)`` of the registered region is ever read or written.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import APIError

SHM_ROOT = "/dev/shm"
_KEY = re.compile(r"/?([A-Za-z0-9_][A-Za-z0-9_.\-]{0,254})")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")
_OWN = ("psm_", "irpe", "triton_python_backend")  # this server's slots, Python's SharedMemory, Triton stubs
MAX_INT = 2**63 - 1
_CODES = {400: "invalid_input", 403: "forbidden", 404: "not_found"}


def _bad(message: str, status: int = 400) -> APIError:
    return APIError(status, _CODES[status], message)


@dataclass
class Region:
    """One registered region: ``byte_size`` bytes of ``/dev/shm/<key>`` from ``offset``."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    writable: bool

    def status(self) -> dict[str, Any]:
        """Triton's status entry."""
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def span(self, offset: int, size: int) -> int:
        """The file position of ``[offset, offset + size)`` of this region (400 when it leaves the region)."""
        if type(offset) is not int or type(size) is not int or offset < 0 or size < 0 \
                or offset + size > self.byte_size:
            raise _bad(f"{size} bytes at offset {offset} are outside shared memory region {self.name!r} "
                       f"({self.byte_size} bytes)")
        return self.offset + offset


class SharedMemoryRegistry:
    """The registered regions of one process (thread-safe; see the module docstring)."""

    def __init__(self, enabled: bool = False, max_regions: int = 64, max_bytes: int = 1 << 30,
                 root: str = SHM_ROOT) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.root = root
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def require_enabled(self) -> None:
        """403 naming the flag unless client shared memory is on."""
        if not self.enabled:
            raise _bad("client shared memory is off on this server; start irpe serve with --allow-client-shm "
                       "(IRPE_ALLOW_CLIENT_SHM=1) to register regions", 403)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register ``byte_size`` bytes of ``/dev/shm/<key>`` from ``offset`` as region ``name``."""
        self.require_enabled()
        _check_name(name)
        base = _check_key(key)
        for what, v in (("offset", offset), ("byte_size", byte_size)):
            if type(v) is not int or v < 0 or v > MAX_INT:
                raise _bad(f"shared memory {what} must be a non-negative integer, got {v!r}")
        if byte_size == 0 or byte_size > self.max_bytes:
            raise _bad(f"shared memory region {name!r}: byte_size {byte_size} must be 1..{self.max_bytes} "
                       "(--max-shm-region-mb)")
        with self._lock:
            if name in self._regions:
                raise _bad(f"shared memory region {name!r} already in manager")
            if len(self._regions) >= self.max_regions:
                raise _bad(f"already {self.max_regions} shared memory regions registered (the limit); "
                           "unregister one first")
            fd, writable = self._open(base, key)
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise _bad(f"shared memory region {name!r}: offset {offset} + byte_size {byte_size} exceeds "
                               f"the {size} bytes of {key!r}")
            except BaseException:
                os.close(fd)
                raise
            self._regions[name] = Region(name, key, offset, byte_size, fd, writable)

    def _open(self, base: str, key: str) -> tuple[int, bool]:
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd, writable = os.open(base, os.O_RDWR | flags, dir_fd=dir_fd), True
            except PermissionError:
                fd, writable = os.open(base, os.O_RDONLY | flags, dir_fd=dir_fd), False
        except OSError as e:
            raise _bad(f"unable to open shared memory key {key!r}: {e.strerror}") from None
        finally:
            os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _bad(f"shared memory key {key!r} is not a shared memory object")
        return fd, writable

    def unregister(self, name: str | None = None) -> None:
        """Unregister ``name`` (None: every region); an unknown name is no error, as in Triton."""
        with self._lock:
            names = list(self._regions) if name is None else [name] if name in self._regions else []
            for n in names:
                os.close(self._regions.pop(n).fd)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        """Triton's status list: every region, or the one named (404 when unknown, as in Triton)."""
        with self._lock:
            if name is None:
                return [r.status() for r in self._regions.values()]
            return [self._get(name).status()]

    def _get(self, name: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise _bad(f"Unable to find system shared memory region: {name!r}", 404)
        return region

    def check(self, name: str, offset: int, size: int) -> None:
        """404 for an unknown region, 400 when ``[offset, offset + size)`` leaves it (before any work)."""
        with self._lock:
            self._get(name).span(offset, size)

    def read(self, name: str, offset: int, size: int) -> bytearray:
        """A copy of ``size`` bytes at ``offset`` in region ``name`` (400 outside the region)."""
        with self._lock:
            region = self._get(name)
            pos = region.span(offset, size)
            out = bytearray(size)
            got = os.preadv(region.fd, [out], pos) if size else 0
        if got != size:
            raise _bad(f"shared memory region {name!r} shrank: {got} of {size} bytes readable at offset {offset}")
        return out

    def read_array(self, name: str, offset: int, size: int, dtype: str, shape: list[int]) -> np.ndarray:
        """``read`` as an array of ``dtype`` and ``shape`` (``size`` must match exactly)."""
        want = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if size != want:
            raise _bad(f"shared_memory_byte_size {size} does not match the {want} bytes of shape {shape}")
        return np.frombuffer(self.read(name, offset, size), dtype=dtype).reshape(shape)

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` in region ``name`` (400 outside the region or when read-only)."""
        with self._lock:
            region = self._get(name)
            pos = region.span(offset, len(data))
            if not region.writable:
                raise _bad(f"shared memory region {name!r} is read-only for this server")
            done = os.pwrite(region.fd, data, pos)
        if done != len(data):
            raise _bad(f"shared memory region {name!r}: wrote {done} of {len(data)} bytes")

    def close(self) -> None:
        """Unregister everything (at shutdown)."""
        self.unregister()


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(f"shared memory region name {name!r}: use 1-128 letters, digits, '_', '.' or '-'")


def _check_key(key: object) -> str:
    m = _KEY.fullmatch(key) if isinstance(key, str) else None
    if m is None:
        raise _bad(f"shared memory key {key!r}: must be one name in {SHM_ROOT} like '/my_region' (letters, "
                   "digits, '_', '.', '-'; no '/' inside, no leading dot)")
    base = m.group(1)
    if base.startswith(_OWN):
        raise _bad(f"shared memory key {key!r} belongs to the server itself; use another name")
    return base
