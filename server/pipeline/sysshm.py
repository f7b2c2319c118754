"""Client system shared memory (Triton's ``system_shared_memory`` extension), protocol-neutral.

A client creates a POSIX shared-memory object (``/dev/shm/<key>``), registers ``byte_size`` bytes of it from
``offset`` under a region name, and then names regions instead of sending tensor bytes. Every front end (HTTP,
gRPC) calls one :class:`SharedMemoryRegistry` per process.

Off unless ``--allow-client-shm``: a client that can name any file in ``/dev/shm`` could otherwise read or
overwrite other programs' shared memory. Even when on:

- every call names its ``owner``: the uid of the local client, found by the front end from the connection
  (:mod:`.peer`). A region is registered only from a file that uid owns (or whose name starts with the
  operator's ``--shm-name-prefix`` and that has no other name: a hard link to another user's segment, where
  ``fs.protected_hardlinks`` is 0, is refused), and is used, listed and unregistered only by that uid: each
  uid has its own region names, and unregistering all removes only the caller's;
- keys are one plain name in ``/dev/shm`` (no ``/`` inside, no leading dot), opened relative to that folder
  without following links, and must be a regular file; this server's own segments (``psm_*``, ``irpe*``,
  Triton's) are refused;
- at most ``max_regions`` regions per uid of at most ``max_bytes`` each, and the region must lie inside the file;
- reads and writes use ``pread``/``pwrite`` on a duplicate of the held descriptor, outside the registry's lock,
  never a mapping: a file the client shrinks afterwards gives a short read (a clear error), not a SIGBUS, a
  region unregistered meanwhile is not a reused descriptor, and nothing outside ``[offset, offset + byte_size)``
  of the registered region is ever read or written. Callers read in a thread, never on the event loop.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import Settings
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
    """One registered region: ``byte_size`` bytes of ``/dev/shm/<key>`` from ``offset``, registered by ``owner``."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    writable: bool
    owner: int

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
    """The registered regions of one process, each its owner's (thread-safe; see the module docstring)."""

    def __init__(self, enabled: bool = False, max_regions: int = 64, max_bytes: int = 1 << 30,
                 root: str = SHM_ROOT, name_prefix: str = "") -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self.max_bytes = max_bytes
        self.root = root
        self.name_prefix = name_prefix
        self._regions: dict[tuple[int, str], Region] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> SharedMemoryRegistry:
        """The registry ``--allow-client-shm`` and its limits ask for (one per process, held by its front ends).

        Args:
            settings: the server's settings.

        Returns:
            An empty registry (off unless ``settings.allow_client_shm``).
        """
        return cls(settings.allow_client_shm, settings.max_shm_regions, int(settings.max_shm_region_mb * 2**20),
                   name_prefix=settings.shm_name_prefix)

    def require_enabled(self) -> None:
        """403 naming the flag unless client shared memory is on."""
        if not self.enabled:
            raise _bad("client shared memory is off on this server; start irpe serve with --allow-client-shm "
                       "(IRPE_ALLOW_CLIENT_SHM=1) to register regions", 403)

    def owned_by(self, owner: int) -> OwnedRegions:
        """This registry as the client of uid ``owner`` sees it."""
        return OwnedRegions(self, owner)

    def register(self, name: str, key: str, offset: int, byte_size: int, *, owner: int) -> None:
        """Register ``byte_size`` bytes of ``/dev/shm/<key>`` from ``offset`` as region ``name`` of ``owner``.

        Raises:
            APIError: 403 when off or the file is not ``owner``'s (nor under the operator's name prefix);
                400 for a bad name, key, offset or size, a name ``owner`` already uses, or too many regions.
        """
        self.require_enabled()
        _check_name(name)
        base = _check_key(key)
        for what, v in (("offset", offset), ("byte_size", byte_size)):
            if type(v) is not int or v < 0 or v > MAX_INT:
                raise _bad(f"shared memory {what} must be a non-negative integer, got {v!r}")
        if byte_size == 0 or byte_size > self.max_bytes:
            raise _bad(f"shared memory region {name!r}: byte_size {byte_size} must be 1..{self.max_bytes} "
                       "(--max-shm-region-mb)")
        fd, writable = self._open(base, key)
        try:
            self._check_file(fd, base, key, offset, byte_size, owner)
            with self._lock:
                if (owner, name) in self._regions:
                    raise _bad(f"shared memory region {name!r} already in manager")
                if sum(1 for o, _ in self._regions if o == owner) >= self.max_regions:
                    raise _bad(f"already {self.max_regions} shared memory regions registered (the limit per "
                               "client user, --max-shm-regions); unregister one first")
                self._regions[(owner, name)] = Region(name, key, offset, byte_size, fd, writable, owner)
        except BaseException:
            os.close(fd)
            raise

    def _check_file(self, fd: int, base: str, key: str, offset: int, byte_size: int, owner: int) -> None:
        """The open file is ``owner``'s (or named under the operator's prefix) and holds the region."""
        info = os.fstat(fd)
        if info.st_uid != owner and not (self.name_prefix and base.startswith(self.name_prefix)):
            where = f" or name it with the prefix {self.name_prefix!r} (--shm-name-prefix)" if self.name_prefix \
                else ""
            raise _bad(f"shared memory key {key!r} is owned by uid {info.st_uid}, not by uid {owner} that asked to "
                       f"register it; create the segment as that user{where}", 403)
        if info.st_uid != owner and info.st_nlink != 1:  # the prefix vouches for the name, not for other links
            raise _bad(f"shared memory key {key!r} has {info.st_nlink} links: a segment registered by its "
                       f"--shm-name-prefix name must be a file of that one name, not a hard link to another; create "
                       "the segment under the prefix", 403)
        if offset + byte_size > info.st_size:
            raise _bad(f"shared memory region: offset {offset} + byte_size {byte_size} exceeds the "
                       f"{info.st_size} bytes of {key!r}")

    def _open(self, base: str, key: str) -> tuple[int, bool]:
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            try:
                fd = os.open(base, os.O_RDWR | flags, dir_fd=dir_fd)
                writable = True
            except PermissionError:
                fd = os.open(base, os.O_RDONLY | flags, dir_fd=dir_fd)
                writable = False
        except OSError as e:
            raise _bad(f"unable to open shared memory key {key!r}: {e.strerror}") from None
        finally:
            os.close(dir_fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise _bad(f"shared memory key {key!r} is not a shared memory object")
        return fd, writable

    def unregister(self, name: str | None = None, *, owner: int) -> None:
        """Unregister ``owner``'s region ``name`` (None: every region of ``owner``); an unknown name is no
        error, as in Triton."""
        with self._lock:
            keys = [k for k in self._regions if k[0] == owner and name in (None, k[1])]
            for k in keys:
                os.close(self._regions.pop(k).fd)

    def status(self, name: str | None = None, *, owner: int) -> list[dict[str, Any]]:
        """Triton's status list of ``owner``'s regions, or the one named (404 when unknown, as in Triton)."""
        with self._lock:
            if name is None:
                return [r.status() for (o, _), r in self._regions.items() if o == owner]
            return [self._get(owner, name).status()]

    def _get(self, owner: int, name: str) -> Region:
        region = self._regions.get((owner, name))
        if region is None:
            raise _bad(f"Unable to find system shared memory region: {name!r}", 404)
        return region

    def check(self, name: str, offset: int, size: int, *, owner: int) -> None:
        """404 for a region ``owner`` has not registered, 400 when ``[offset, offset + size)`` leaves it."""
        with self._lock:
            self._get(owner, name).span(offset, size)

    def _hold(self, owner: int, name: str, offset: int, size: int) -> tuple[int, int, Region]:
        """(a duplicate descriptor, the file position, the region): the I/O then runs outside the lock."""
        with self._lock:
            region = self._get(owner, name)
            return os.dup(region.fd), region.span(offset, size), region

    def read(self, name: str, offset: int, size: int, *, owner: int) -> bytearray:
        """A copy of ``size`` bytes at ``offset`` in ``owner``'s region ``name`` (blocking: call it in a thread).

        Raises:
            APIError: 404 for an unknown region, 400 outside the region or when the file has shrunk.
        """
        fd, pos, _ = self._hold(owner, name, offset, size)
        try:
            out = bytearray(size)
            got = os.preadv(fd, [out], pos) if size else 0
        finally:
            os.close(fd)
        if got != size:
            raise _bad(f"shared memory region {name!r} shrank: {got} of {size} bytes readable at offset {offset}")
        return out

    def write(self, name: str, offset: int, data: bytes | memoryview, *, owner: int) -> None:
        """Write ``data`` at ``offset`` in ``owner``'s region ``name``.

        Raises:
            APIError: 404 for an unknown region, 400 outside the region or when it is read-only.
        """
        fd, pos, region = self._hold(owner, name, offset, len(data))
        try:
            if not region.writable:
                raise _bad(f"shared memory region {name!r} is read-only for this server")
            done = os.pwrite(fd, data, pos)
        finally:
            os.close(fd)
        if done != len(data):
            raise _bad(f"shared memory region {name!r}: wrote {done} of {len(data)} bytes")

    def close(self) -> None:
        """Unregister every owner's regions (at shutdown)."""
        with self._lock:
            for region in self._regions.values():
                os.close(region.fd)
            self._regions.clear()


@dataclass(frozen=True)
class OwnedRegions:
    """The regions of one client uid: what an inference request that names a region may use."""

    registry: SharedMemoryRegistry
    owner: int

    def check(self, name: str, offset: int, size: int) -> None:
        """:meth:`SharedMemoryRegistry.check` for this owner."""
        self.registry.check(name, offset, size, owner=self.owner)

    def read_array(self, name: str, offset: int, size: int, dtype: str, shape: list[int]) -> np.ndarray:
        """The region's bytes as an array of ``dtype`` and ``shape`` (``size`` must match exactly; blocking)."""
        want = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if size != want:
            raise _bad(f"shared_memory_byte_size {size} does not match the {want} bytes of shape {shape}")
        raw = self.registry.read(name, offset, size, owner=self.owner)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        """:meth:`SharedMemoryRegistry.write` for this owner."""
        self.registry.write(name, offset, data, owner=self.owner)


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
