"""Tensors an ONNX file keeps in other files ("external data"), found without the onnx package.

ONNX Runtime and OpenVINO read a tensor's bytes from another file when the tensor's ``data_location`` is
EXTERNAL (its ``external_data`` entries name the file), and both keep that file mapped while the model
runs: a later write to it changes a loaded model with no reload and no checksum. An artifact is therefore
one checksummed ``.onnx`` file, and :func:`external_tensors` lets the loader refuse anything else.

The walk reads the protobuf wire format of the messages that can hold a tensor (graph initializers,
node attributes, subgraphs, functions, training graphs, sparse tensors), skipping tensor bytes unread.
A file that is not well-formed protobuf yields nothing here: the runtime's parser reads the same wire
format and refuses it. Nesting deeper than :data:`MAX_DEPTH` (protobuf's own default limit) is an error.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from .protowire import Malformed, fields

MAX_DEPTH = 100
LISTED = 16  # the most external tensors a scan lists: the loader refuses a file at the first, and a hostile one
# can hold millions (4 bytes each), which as a list would cost gigabytes before the refusal
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# message -> {field number: embedded message} (onnx.proto: the fields through which a tensor is reachable)
_CHILDREN: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "function": {7: "node", 11: "attribute"},
    "training": {1: "graph", 2: "graph"},
    "sparse": {1: "tensor", 2: "tensor"},
}


@dataclass(frozen=True)
class ExternalTensor:
    """A tensor whose data lives outside the .onnx file: its name and the file it names ("" if none)."""

    name: str
    location: str


class TooDeep(ValueError):
    """Messages nested deeper than MAX_DEPTH."""


class _Listed(Exception):
    """The scan has listed as many external tensors as it lists (:data:`LISTED`)."""


def external_tensors(path: str | Path, most: int = LISTED) -> list[ExternalTensor]:
    """The tensors of the ONNX file ``path`` stored outside it, in file order, the first ``most`` of them (the
    walk stops there); [] for a self-contained file.

    Args:
        path: the ONNX file.
        most: the most tensors listed.

    Returns:
        The external tensors found, at most ``most``.

    Raises:
        TooDeep: messages nested deeper than :data:`MAX_DEPTH`.
    """
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            found: list[ExternalTensor] = []
            try:
                _walk(buf, 0, len(buf), "model", 0, found, most)
            except _Listed:
                pass
            except Malformed:  # left to the runtime, which refuses it
                return []
            return found


def _walk(buf: mmap.mmap, start: int, end: int, kind: str, depth: int, found: list[ExternalTensor],
          most: int) -> None:
    if depth > MAX_DEPTH:
        raise TooDeep(f"ONNX messages nested deeper than {MAX_DEPTH} levels")
    if kind == "tensor":
        _tensor(buf, start, end, found, most)
        return
    children = _CHILDREN[kind]
    for number, wire, a, b, _ in fields(buf, start, end):
        if wire == 2 and number in children:
            _walk(buf, a, b, children[number], depth + 1, found, most)


def _tensor(buf: mmap.mmap, start: int, end: int, found: list[ExternalTensor], most: int) -> None:
    """Record the tensor if it is external (data_location EXTERNAL, or any external_data entry at all); stop the
    walk once ``most`` are recorded."""
    name, location, external = "", "", False
    for number, wire, a, b, _ in fields(buf, start, end):
        if number == 8 and wire == 2:
            name = buf[a:b].decode("utf-8", "replace")
        elif number == 13 and wire == 2:
            external = True
            entry = {k: buf[x:y] for k, w, x, y, _ in fields(buf, a, b) if w == 2 and k in (1, 2)}
            if entry.get(1) == b"location":
                location = entry.get(2, b"").decode("utf-8", "replace")
        elif number == 14 and wire == 0 and a == _EXTERNAL:
            external = True
    if external:
        found.append(ExternalTensor(name, location))
        if len(found) >= most:
            raise _Listed
