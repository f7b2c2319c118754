"""The model repository on disk: ``<repo>/<model>/<version>/`` artifact directories (Triton's layout).

A directory holding ``model.json`` is a plain artifact: one model (named by model.json) with version 1.
Otherwise every sub-directory is a model, and its sub-directories named by a positive integer are its
versions. An optional ``<model>/config.json`` sets the model's ``version_policy`` in Triton's JSON form
(``{"latest": {"num_versions": 2}}``, ``{"all": {}}`` or ``{"specific": {"versions": [1, 3]}}``; default:
the latest version) and ``max_queue`` (images queued for that model before 503; default ``--max-queue``).
Torch-free, and reads nothing but names, sizes, mtimes and two small JSON files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from irpe.artifact import ArtifactError


class RepositoryError(ArtifactError):
    """The repository layout or a model's config.json is wrong; the message names the fix."""


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model are served: the latest ``n``, all, or the listed ones."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve out of ``available``, ascending."""
        have = sorted(available)
        if self.kind == "all":
            return have
        if self.kind == "specific":
            return [v for v in have if v in self.versions]
        return have[-self.num_versions:] if have else []

    def to_config(self) -> dict[str, Any]:
        """Triton's JSON form."""
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.num_versions}}

    @classmethod
    def from_config(cls, raw: object, where: str) -> VersionPolicy:
        """Parse Triton's JSON form; RepositoryError naming ``where`` and the accepted forms."""
        hint = (f'{where}: version_policy must be {{"latest": {{"num_versions": N}}}}, {{"all": {{}}}} or '
                f'{{"specific": {{"versions": [1, 2]}}}}, got {raw!r}')
        if not isinstance(raw, dict) or len(raw) != 1:
            raise RepositoryError(hint)
        kind, body = next(iter(raw.items()))
        body = body if isinstance(body, dict) else None
        if kind == "all" and body is not None:
            return cls("all")
        if kind == "latest" and body is not None:
            n = body.get("num_versions", 1)
            if type(n) is int and n >= 1:
                return cls("latest", n)
        if kind == "specific" and body is not None:
            vs = body.get("versions")
            if isinstance(vs, list) and vs and all(type(v) is int and v >= 1 for v in vs):
                return cls("specific", versions=tuple(sorted(vs)))
        raise RepositoryError(hint)


@dataclass
class ModelConfig:
    """A model's optional config.json."""

    policy: VersionPolicy = field(default_factory=VersionPolicy)
    max_queue: int = 0  # 0: the server's --max-queue


@dataclass
class ModelDir:
    """One model found on disk: its config and version -> directory."""

    name: str
    config: ModelConfig
    versions: dict[int, Path]
    error: str = ""  # a config.json that cannot be read: the model is not loaded, the index says why


def is_plain_artifact(root: Path) -> bool:
    """True when ``root`` is one artifact directory (holds model.json), not a repository."""
    return (root / "model.json").is_file()


def _plain_name(root: Path) -> str:
    try:
        name = json.loads((root / "model.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else root.name


def read_config(model_dir: Path) -> ModelConfig:
    """``<model>/config.json`` (absent: defaults); RepositoryError for a bad one."""
    path = model_dir / "config.json"
    if not path.is_file():
        return ModelConfig()
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RepositoryError(f"{path}: not valid JSON ({e}); fix or remove it") from None
    if not isinstance(raw, dict):
        raise RepositoryError(f"{path}: expected a JSON object with version_policy and/or max_queue")
    policy = VersionPolicy.from_config(raw["version_policy"], str(path)) if "version_policy" in raw else \
        VersionPolicy()
    max_queue = raw.get("max_queue", 0)
    if type(max_queue) is not int or max_queue < 0:
        raise RepositoryError(f"{path}: max_queue must be a positive integer, got {max_queue!r}")
    return ModelConfig(policy, max_queue)


def _versions(model_dir: Path) -> dict[int, Path]:
    out = {}
    for p in model_dir.iterdir():
        if p.is_dir() and p.name.isascii() and p.name.isdigit() and int(p.name) >= 1:
            out[int(p.name)] = p
    return out


def scan(root: Path) -> dict[str, ModelDir]:
    """Every model under ``root`` (a plain artifact directory is one model, version 1)."""
    if is_plain_artifact(root):
        return {(name := _plain_name(root)): ModelDir(name, ModelConfig(), {1: root})}
    if not root.is_dir():
        raise RepositoryError(f"{root}: no such directory; pass an artifact directory (with model.json) or a "
                              "model repository (<model>/<version>/model.json)")
    models = {}
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        try:
            models[d.name] = ModelDir(d.name, read_config(d), _versions(d))
        except RepositoryError as e:
            models[d.name] = ModelDir(d.name, ModelConfig(), _versions(d), error=str(e))
    return models


def check_layout(root: Path) -> dict[str, ModelDir]:
    """:func:`scan`, refusing a repository without a single ``<model>/<version>/`` directory."""
    models = scan(root)
    if not any(m.versions for m in models.values()):
        raise RepositoryError(f"{root}: neither an artifact directory (no model.json: write one with `irpe export`) "
                              "nor a model repository (no <model>/<version>/ directories, version = a positive "
                              "integer); see docs/serving.md, 'Model repository'")
    return models


def signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every file in a version directory: changes when a version is rewritten."""
    out = []
    for p in sorted(path.iterdir()) if path.is_dir() else []:
        if p.is_file():
            st = p.stat()
            out.append((p.name, st.st_size, st.st_mtime_ns))
    return tuple(out)
