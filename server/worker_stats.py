"""Triton statistics summed over the processes of ``irpe serve --workers N``.

Each worker is a whole server behind one port, and the kernel hands each connection to one of them, so a
worker's own counters describe only the requests it took. perf_analyzer reads ``/v2/models/{m}/stats`` before
and after each window and keeps the version whose counts grew; with per-worker counts a start read from one
worker and an end read from another show no growth. Here every worker copies its counters of a model version
into its own row of a file that every worker maps (one file per version, in a directory only this user can
open, made by the launcher before the workers start and removed when they have stopped), and answers with the
sum of the rows: the server's counts, whichever worker answers.

A row is the worker's :class:`~.stats.ModelStats` as int64 values, rewritten after each update under that
object's lock; a reader sums the rows without a lock, so a sum taken during an update may hold one request's
counters and not yet its batch's (the next read has both). The process-wide Prometheus series (``/metrics``
outside the ``nv_*`` family) stay per worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .stats import FAIL_REASONS, PHASES, BatchPhases, ModelStats, duration

log = logging.getLogger("irpe.server")
DIRECTORY_ENV = "IRPE_WORKER_STATS_DIR"  # set by the launcher for its workers; not a setting
MAX_ROWS = 64  # rows per file: a restarted worker takes the next one (modulo: counts then add up in a used row)
_TOTALS = ("success", "fail", "queue", *PHASES)
_HEAD = 2 * len(_TOTALS) + 3 + len(FAIL_REASONS)  # totals (count, ns), images, engine calls, last ms, reasons
_rows: dict[str, int] = {}  # this process's row in each directory, claimed once


@contextlib.contextmanager
def shared_directory() -> Iterator[Path | None]:
    """The directory of the rows for the workers started inside the block (``IRPE_WORKER_STATS_DIR``).

    Yields:
        The directory (mode 0700, in the temporary directory: ``TMPDIR``), removed with its files when the block
        ends; None where it cannot be made (logged: each worker then counts alone).
    """
    try:
        path = Path(tempfile.mkdtemp(prefix="irpe-worker-stats-"))
    except OSError as e:
        log.warning("statistics count each worker alone: cannot make their shared directory (%s); set TMPDIR to "
                    "a writable directory", e)
        yield None
        return
    os.environ[DIRECTORY_ENV] = str(path)
    try:
        yield path
    finally:
        os.environ.pop(DIRECTORY_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def shared_stats(name: str, version: int, sizes: list[int]) -> ModelStats | None:
    """Counters of one model version summed over the workers, or None outside ``--workers N``.

    Args:
        name: the model.
        version: its version.
        sizes: the batcher's batch sizes (each row has a place for each).

    Returns:
        The shared counters, or None when no directory is set or the version's file cannot be used (logged:
        the worker then counts alone).
    """
    directory = os.environ.get(DIRECTORY_ENV)
    if not directory:
        return None
    try:
        return SharedStats(Path(directory), f"{name}/{version}", sizes)
    except (OSError, ValueError) as e:
        log.warning("statistics of %s version %d count this worker only: %s", name, version, e)
        return None


def _claim_row(directory: Path) -> int:
    """This process's row: the next number of the directory's counter file (under an exclusive lock)."""
    if str(directory) not in _rows:
        fd = os.open(directory / "rows", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            taken = int(os.pread(fd, 32, 0) or b"0")
            os.pwrite(fd, str(taken + 1).encode().ljust(32), 0)
            _rows[str(directory)] = taken % MAX_ROWS
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    return _rows[str(directory)]


class SharedStats(ModelStats):
    """:class:`~.stats.ModelStats` whose :meth:`to_triton` sums every worker's row (module docstring)."""

    def __init__(self, directory: Path, key: str, sizes: list[int]):
        super().__init__()
        self.sizes = sorted(sizes)
        self.width = _HEAD + 2 * len(PHASES) * len(self.sizes)
        size = MAX_ROWS * self.width * 8
        path = directory / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".stats")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            found = os.fstat(fd).st_size
            if found == 0:
                os.ftruncate(fd, size)
            elif found != size:
                raise ValueError(f"{path} holds {found} bytes, not {size}: another batch size list")
            self._map = mmap.mmap(fd, size)  # its own copy of the descriptor: the lock is released below
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._values = memoryview(self._map).cast("q")
        self._row = _claim_row(directory) * self.width
        self._packer = struct.Struct(f"{self.width}q")

    def request(self, ok: bool, seconds: float, reason: str = "OTHER") -> None:
        super().request(ok, seconds, reason)
        self._publish()

    def batch(self, *, size: int, queue_s: list[float], requests: int, phases: BatchPhases) -> None:
        super().batch(size=size, queue_s=queue_s, requests=requests, phases=phases)
        self._publish()

    def _publish(self) -> None:
        """Copy this worker's counters into its row (under the lock, so the row is one state of them)."""
        with self._lock:
            values = [n for name in _TOTALS for n in self._totals[name]]
            values += [self.inference_count, self.execution_count, self.last_inference_ms]
            values += [self._reasons[r] for r in FAIL_REASONS]
            for size in self.sizes:
                per = self._by_batch.get(size)
                values += [n for name in PHASES for n in per[name]] if per else [0] * (2 * len(PHASES))
            self._values[self._row:self._row + self.width] = memoryview(self._packer.pack(*values)).cast("q")

    def to_triton(self, name: str, version: str = "1", reasons: bool = False) -> dict[str, Any]:
        width, values = self.width, self._values
        rows = [values[r * width:(r + 1) * width].tolist() for r in range(MAX_ROWS)]
        total = [sum(column) for column in zip(*rows, strict=True)]
        last = max(row[2 * len(_TOTALS) + 2] for row in rows)
        infer = {k: duration(total[2 * i], total[2 * i + 1]) for i, k in enumerate(_TOTALS)}
        infer["cache_hit"] = duration()
        infer["cache_miss"] = duration()
        batches = []
        for j, size in enumerate(self.sizes):
            at = _HEAD + j * 2 * len(PHASES)
            per = {k: duration(total[at + 2 * i], total[at + 2 * i + 1]) for i, k in enumerate(PHASES)}
            if per["compute_infer"]["count"]:
                batches.append({"batch_size": size, **per})
        count_at = 2 * len(_TOTALS)
        out = {"name": name, "version": version, "last_inference": last, "inference_count": total[count_at],
               "execution_count": total[count_at + 1], "inference_stats": infer, "response_stats": {},
               "batch_stats": batches, "memory_usage": []}
        if reasons:
            out["fail_reasons"] = dict(zip(FAIL_REASONS, total[count_at + 3:count_at + 3 + len(FAIL_REASONS)],
                                           strict=True))
        return out

