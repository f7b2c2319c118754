"""``irpe bench digits``: accuracy of a digits artifact per rendering family, served and offline.

Served: every rendering of the held-out split (:func:`irpe.training.renderings.held_out_set`) is POSTed
as an image file to a real ``irpe serve`` on 127.0.0.1 (several files per request). Offline: the same
bytes through the server's own decode + preprocessing and an ONNX Runtime session, in process. The two
must agree image for image.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Item = tuple[str, int, bytes, int]  # family, held-out index, file bytes, label


@dataclass
class FamilyScore:
    """Counts of one rendering family."""

    total: int = 0
    served: int = 0
    offline: int = 0
    mismatches: list[int] = field(default_factory=list)  # held-out indices where served != offline

    @property
    def served_acc(self) -> float:
        return self.served / self.total if self.total else 0.0


def rendered_items(per_family: int | None = None, families: list[str] | None = None) -> list[Item]:
    """The held-out renderings as (family, index, file bytes, label)."""
    from irpe.training.renderings import held_out_set, image_bytes

    return [(f, i, image_bytes(px, r), y) for f, i, r, px, y in held_out_set(families, per_family)]


def _multipart(blobs: list[bytes]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = [f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d{n}\"\r\n"
             f"Content-Type: application/octet-stream\r\n\r\n".encode() + b + b"\r\n" for n, b in enumerate(blobs)]
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def served_labels(url: str, blobs: list[bytes], per_request: int = 16, api_key: str = "") -> list[str]:
    """Top-1 labels from ``POST url/classify``, ``per_request`` files per request."""
    out: list[str] = []
    for start in range(0, len(blobs), per_request):
        body, ctype = _multipart(blobs[start:start + per_request])
        headers = {"Content-Type": ctype} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
        req = urllib.request.Request(url.rstrip("/") + "/classify?top_k=1", data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=60) as r:
            out += [p[0]["label"] for p in json.loads(r.read())["predictions"]]
    return out


def offline_labels(artifact_dir: Path, blobs: list[bytes]) -> list[str]:
    """Top-1 labels from the server's decode + preprocessing and ONNX Runtime, in this process."""
    import onnxruntime as ort

    from irpe.artifact import load_artifact
    from irpe.server.pipeline.decode import prepare

    art = load_artifact(artifact_dir)
    sess = ort.InferenceSession(str(Path(artifact_dir) / art.onnx_file), providers=["CPUExecutionProvider"])
    out: list[str] = []
    for start in range(0, len(blobs), 64):
        x = np.stack([prepare(b, art.preprocess, 40_000_000) for b in blobs[start:start + 64]])
        out += [art.labels[int(k)] for k in sess.run(None, {art.input_name: x})[0].argmax(1)]
    return out


def score(items: list[Item], served: list[str], offline: list[str]) -> dict[str, FamilyScore]:
    """Per-family counts (in the families' order)."""
    table: dict[str, FamilyScore] = {}
    for (family, index, _, label), s, o in zip(items, served, offline, strict=True):
        fs = table.setdefault(family, FamilyScore())
        fs.total += 1
        fs.served += s == str(label)
        fs.offline += o == str(label)
        if s != o:
            fs.mismatches.append(index)
    return table


def format_table(table: dict[str, FamilyScore]) -> str:
    """Markdown table: family, images, served accuracy, offline accuracy, served != offline."""
    lines = ["| family | images | served | offline | served != offline |", "| --- | --- | --- | --- | --- |"]
    rows: Iterable[tuple[str, FamilyScore]] = table.items()
    for name, fs in rows:
        lines.append(f"| {name} | {fs.total} | {fs.served_acc:.2%} | {fs.offline / fs.total:.2%} | "
                     f"{len(fs.mismatches)} |")
    total = FamilyScore(sum(f.total for f in table.values()), sum(f.served for f in table.values()),
                        sum(f.offline for f in table.values()))
    lines.append(f"| **all** | {total.total} | {total.served_acc:.2%} | {total.offline / max(total.total, 1):.2%} | "
                 f"{sum(len(f.mismatches) for f in table.values())} |")
    return "\n".join(lines)


def run_digits_bench(artifact: str = "digits", per_family: int | None = None, url: str | None = None,
                     families: list[str] | None = None) -> dict[str, FamilyScore]:
    """Entry point of ``irpe bench digits``: serve ``artifact`` with ``irpe serve`` (unless ``url`` is
    given), score every family served and offline, print the table."""
    from irpe.artifact.builtin import resolve_artifact_dir

    from .serve import _free_port, server_process

    artifact_dir = resolve_artifact_dir(artifact)
    items = rendered_items(per_family, families)
    blobs = [b for _, _, b, _ in items]
    if url is None:
        port = _free_port()
        with server_process(["-m", "irpe.cli", "serve", str(artifact_dir), "--port", str(port),
                             "--log-level", "warning"], port):
            served = served_labels(f"http://127.0.0.1:{port}", blobs)
    else:
        served = served_labels(url, blobs)
    table = score(items, served, offline_labels(artifact_dir, blobs))
    print(f"artifact: {artifact_dir}\n{format_table(table)}")
    return table
