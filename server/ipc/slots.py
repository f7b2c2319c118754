"""Shared-memory image slots: a front-end process writes preprocessed images, the engine process reads them.

The front end owns a :class:`SlotPool` (one POSIX shared-memory block of ``slots`` images of the model's
input shape) and hands the engine slot numbers, never pixels: the engine attaches the block once
(:func:`attach`) and stacks its batches straight from those views. A slot is reused only after the engine
answered for it. Free slots are a stack, so a lightly loaded server touches only the few pages it reuses.
One pool per input shape (crop size); the frames that describe and use them are in :mod:`.wire`.
"""

from __future__ import annotations

import contextlib
import threading
from multiprocessing import shared_memory
from typing import Any

import numpy as np


class SlotPool:
    """``slots`` float32 images of ``shape`` in one shared-memory block (created here, unlinked on close)."""

    def __init__(self, slots: int, shape: tuple[int, ...], dtype: str = "float32"):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.slots = slots
        self.item_bytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.shm = shared_memory.SharedMemory(create=True, size=max(1, slots * self.item_bytes))
        self.array = np.ndarray((slots, *self.shape), self.dtype, buffer=self.shm.buf)
        self._free = list(range(slots - 1, -1, -1))
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.shm.name

    @property
    def free(self) -> int:
        return len(self._free)

    def put(self, images: list[np.ndarray]) -> list[int] | None:
        """Copy ``images`` into free slots (all or none); None when too few are free."""
        with self._lock:
            if len(self._free) < len(images):
                return None
            taken = [self._free.pop() for _ in images]
        for slot, x in zip(taken, images, strict=True):
            self.array[slot] = x
        return taken

    def release(self, slots: list[int]) -> None:
        """Give slots back once the engine has answered for them."""
        with self._lock:
            self._free.extend(slots)

    def describe(self) -> dict[str, Any]:
        """What the engine needs to attach the block."""
        return {"shm": self.name, "slots": self.slots, "shape": list(self.shape), "dtype": self.dtype.name}

    def close(self) -> None:
        """Unmap and unlink the block (unless the engine did, on seeing this front end's link close)."""
        del self.array
        self.shm.close()
        with contextlib.suppress(FileNotFoundError):
            self.shm.unlink()


def attach(desc: dict[str, Any]) -> tuple[shared_memory.SharedMemory, np.ndarray]:
    """The engine side: map a front end's block. The front end owns and unlinks it; Python < 3.13 also
    registers an attached block with the resource tracker, which the supervisor's children share, so the
    registration is the same one. The engine unlinks a front end's blocks when its link closes (a front end
    killed before unlinking included)."""
    shm = shared_memory.SharedMemory(name=desc["shm"])
    array = np.ndarray((int(desc["slots"]), *desc["shape"]), np.dtype(desc["dtype"]), buffer=shm.buf)
    return shm, array
