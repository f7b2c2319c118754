"""Process memory and collector settings of the server."""

from __future__ import annotations

import gc

from irpe.server.memory import GC_THRESHOLD, tune_gc


def test_tune_gc_freezes_what_exists_and_collects_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0  # the loaded modules are out of the collector's view
        assert gc.get_threshold()[0] == GC_THRESHOLD > before[0]
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
