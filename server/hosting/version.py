"""One version of one model as every host keeps it: its state, why it is not serving, what runs it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from irpe.artifact import ModelArtifact

from ..batch_queue import BatchQueue
from ..engines.base import Engine, EngineInfo

UNLOADED = "unloaded"  # the reason the index shows for a version (or model) unloaded on purpose

_VERSION = re.compile(r"[0-9]{1,18}")  # ASCII digits only ('²'.isdigit() is true), at most 18 of them


def parse_version(version: str | int) -> int:
    """A version number a client sent (path or query), parsed once.

    Args:
        version: the client's text (or a number already parsed).

    Returns:
        The number; -1 unless the text is a plain ASCII number of at most 18 digits.
    """
    if isinstance(version, int):
        return version
    return int(version) if _VERSION.fullmatch(version) else -1


def clip(text: str, limit: int = 80) -> str:
    """A client's string shortened for a message (model names and versions come from the URL).

    Args:
        text: what the client sent.
        limit: the most characters kept.

    Returns:
        ``text``, or its first ``limit`` characters followed by its length.
    """
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class VersionState(str, Enum):
    """Where a model version is in its life, in Triton's words (the text the repository index shows)."""

    LOADING = "LOADING"  # read and built, not yet warm: not routable (startup reports it before warm-up)
    READY = "READY"  # warm and routable
    UNAVAILABLE = "UNAVAILABLE"  # failed (``reason`` says why) or unloaded on purpose (``unloaded``)

    def __str__(self) -> str:
        return self.value


_READY = VersionState.READY  # asked several times per request: a module global reads faster than an Enum member


@dataclass(eq=False)
class ModelVersion:
    """One version of one model: loading, READY, or UNAVAILABLE with the reason."""

    name: str
    version: int
    path: Path
    artifact: ModelArtifact | None = None
    engine: Engine | None = None  # in the process that runs it (LocalHost) only
    batcher: BatchQueue | None = None  # kept (stopped) after the version is retired: never another's
    state: VersionState = VersionState.LOADING
    reason: str = ""  # text for clients (the index, 503 answers); control flow reads ``unloaded`` instead
    unloaded: bool = False  # UNAVAILABLE because it was unloaded or replaced on purpose, not because it failed
    signature: tuple = ()
    users: int = 0  # requests holding this version (see ModelHost.acquire)
    info: EngineInfo | None = None  # what runs it (its engine's facts, in every process)
    leaving: bool = False  # being retired: still answers requests already routed to it, announced no more
    rejected: tuple = ()  # the signature of files rewritten in place that failed to load (this one serves on)

    @property
    def ready(self) -> bool:
        """Whether it is warm and routable (state READY)."""
        return self.state is _READY

    @property
    def failure(self) -> str:
        """Why it failed (to load, to warm up, a rewrite in place, its inference thread); "" when nothing
        failed or it was unloaded on purpose."""
        return "" if self.unloaded else self.reason

    def mark_ready(self) -> None:
        """Warm: routable from now on."""
        self.state = VersionState.READY

    def mark_unavailable(self, reason: str) -> None:
        """Failed: not routable; ``reason`` is what the index and 503 answers say.

        Args:
            reason: why, for clients (what was asked, what was found, the fix).
        """
        self.state = VersionState.UNAVAILABLE
        self.reason = reason
        self.unloaded = False

    def mark_unloaded(self) -> None:
        """Unloaded on purpose (unload, replaced by its successor, gone from disk): not routable, not failed."""
        self.state = VersionState.UNAVAILABLE
        self.reason = UNLOADED
        self.unloaded = True

    def reject_rewrite(self, failed: ModelVersion) -> None:
        """Its files were rewritten in place and the new ones (``failed``) did not load: it keeps serving,
        the index says why, and a poll does not retry those files.

        Args:
            failed: the version built from the files now on disk, UNAVAILABLE with the reason.
        """
        self.reason = (f"the files now on disk failed to load ({failed.reason}); the version loaded before keeps "
                       "serving")
        self.rejected = failed.signature

    def is_current(self, on_disk: tuple, retry_failed: bool) -> bool:
        """Whether there is nothing to load: it is loaded from the files on disk, or failed on them and a poll
        does not retry them (a failed load, or a failed rewrite in place while it serves).

        Args:
            on_disk: the signature of the version's files now.
            retry_failed: whether a version that failed on these files is tried again (load: yes; poll: no).

        Returns:
            True when the version stands as it is.
        """
        if self.leaving:
            return False
        if self.signature == on_disk:
            return self.ready or (not retry_failed and not self.unloaded)
        return not retry_failed and self.ready and self.rejected == on_disk

    def entry(self) -> dict[str, str]:
        """Its row of Triton's repository index.

        Returns:
            ``name``, ``version`` and ``state`` as text, and ``reason`` when there is one (as Triton writes it).
        """
        row = {"name": self.name, "version": str(self.version), "state": self.state.value}
        return {**row, "reason": self.reason} if self.reason else row
