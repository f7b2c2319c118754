"""Binary infer requests whose JSON header was seen before: the parse and checks of the first, kept.

A client of the binary tensor extension sends the same JSON header call after call (tritonclient and
``perf_analyzer`` do: only the tensor's bytes change). Parsing and checking that header (strict JSON, the input's
name, datatype and shape, the batch limit, the binary size, the requested outputs) costs more on the event loop
than the rest of the request's decoding. A header that passed every check is remembered with what the checks
found (:class:`KnownHeader`, at most :data:`KNOWN_HEADERS` of at most :data:`KNOWN_HEADER_BYTES`, forgotten all at
once), for the artifact they held for. A later request with the same header bytes, the same header
length and a body of the same size is the same request with another tensor: it takes the parse of the first, byte
for byte what parsing it again would find; its tensor's values, and its batch against the limit, are checked as
every request's are.

Only the requests this serves are remembered: an uncompressed body with the tensor in it (not in client shared
memory), and no request ``id`` but the empty one (``perf_analyzer`` sends ``"id":""`` on every request; a client
that sends a real id sends a new one each time: its headers would only push the others out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from irpe.artifact import ModelArtifact

KNOWN_HEADERS = 64  # headers remembered (then forgotten all at once)
KNOWN_HEADER_BYTES = 1024  # the longest header remembered (perf_analyzer's is about 200 bytes; a 1 KB header of
# nested empty lists parses to about 30 KB of objects, so all the headers kept hold about 2 MB at most)


@dataclass(frozen=True)
class KnownHeader:
    """A header that passed every check: what they found (the request and its input, read-only from here on; the
    requested outputs, the input's shape), for which artifact, and the size of the body it came with."""

    artifact: ModelArtifact
    body_size: int
    req: dict[str, Any]
    spec: dict[str, Any]
    outputs: list[Any]
    shape: tuple[int, ...]  # the input's

    def images(self, body: bytes, split: int) -> np.ndarray:
        """The request's tensor: the FP32 values after its header (their finiteness still to check)."""
        return np.frombuffer(body, dtype="<f4", count=math.prod(self.shape), offset=split).reshape(self.shape)


_KNOWN: dict[bytes, KnownHeader] = {}


def known(body: bytes, split: int, artifact: ModelArtifact) -> KnownHeader | None:
    """The remembered parse of ``body``'s header (its first ``split`` bytes), when it holds for this request.

    Args:
        body: the request's uncompressed body.
        split: its JSON header's length (``Inference-Header-Content-Length``).
        artifact: the model version's artifact.

    Returns:
        The header's parse, or None: parse and check it.
    """
    if split > KNOWN_HEADER_BYTES:
        return None
    entry = _KNOWN.get(body[:split])
    if entry is None or entry.artifact is not artifact or entry.body_size != len(body):
        return None
    return entry


def remember(body: bytes, split: int, entry: KnownHeader) -> None:
    """Keep ``entry``, the parse of ``body``'s header, when the module docstring's conditions hold (the caller
    has checked the request and found no shared memory and no compression)."""
    if split > KNOWN_HEADER_BYTES or entry.req.get("id"):
        return
    if len(_KNOWN) >= KNOWN_HEADERS:
        _KNOWN.clear()
    _KNOWN[body[:split]] = entry
