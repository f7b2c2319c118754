"""Process memory settings for decoding untrusted images.

glibc adapts its mmap threshold as large blocks are freed (up to 32 MB): after that, image-sized buffers
(Pillow allocates images in blocks of up to 16 MB) come from per-thread arenas that are neither shared
between decode threads nor given back: 16 concurrent 40 Mpx decodes peaked at 2.8 GB and kept 1.6 GB.
Pinning the thresholds fixes both ends: blocks over ``MMAP_THRESHOLD`` are mapped on their own and
unmapped on free (the big images), and up to ``TRIM_THRESHOLD`` of free heap stays mapped so the buffers
of ordinary images are reused without page faults (a 1 MB mmap threshold with glibc's 128 KB trim
threshold cost ~790 page faults and +1.7 ms CPU per 640x480 request).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("irpe.server")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 8 << 20
TRIM_THRESHOLD = 32 << 20


def fix_mmap_threshold(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Pin glibc's mmap and trim thresholds (no dynamic growth); False where there is no glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and \
            bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):
        log.debug("no glibc mallopt here; image buffers use the default allocator settings")
        return False


GC_THRESHOLD = 20_000  # young objects between collections (CPython's default: 700)


def tune_gc() -> None:
    """Once the model is loaded: move every object alive now out of the collector's view (``gc.freeze``:
    the modules, the model, the app are never garbage) and collect the young generation every 20,000
    allocations instead of 700. A request allocates a few thousand short-lived objects, freed by reference
    counting; with the defaults the collector ran several times per request (~10% of the event loop's CPU
    in py-spy). Cycles are still collected, less often."""
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, second, third)
