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
        """The versions to serve.

        Args:
            available: the version numbers on disk, in any order.

        Returns:
            Those the policy serves, ascending.
        """
        have = sorted(available)
        if self.kind == "all":
            return have
        if self.kind == "specific":
            return [number for number in have if number in self.versions]
        return have[-self.num_versions:] if have else []

    def to_config(self) -> dict[str, Any]:
        """The policy in Triton's JSON form.

        Returns:
            ``{"all": {}}``, ``{"specific": {"versions": [...]}}`` or ``{"latest": {"num_versions": n}}``.
        """
        if self.kind == "all":
            return {"all": {}}
        if self.kind == "specific":
            return {"specific": {"versions": list(self.versions)}}
        return {"latest": {"num_versions": self.num_versions}}

    @classmethod
    def from_config(cls, raw: object, where: str) -> VersionPolicy:
        """Parse Triton's JSON form.

        Args:
            raw: the ``version_policy`` value of a config.json.
            where: the file, for the error.

        Returns:
            The policy.

        Raises:
            RepositoryError: ``raw`` is none of the accepted forms (the message names ``where`` and them).
        """
        hint = (f'{where}: version_policy must be {{"latest": {{"num_versions": N}}}}, {{"all": {{}}}} or '
                f'{{"specific": {{"versions": [1, 2]}}}}, got {raw!r}')
        if not isinstance(raw, dict) or len(raw) != 1:
            raise RepositoryError(hint)
        kind, body = next(iter(raw.items()))
        body = body if isinstance(body, dict) else None
        if kind == "all" and body is not None:
            return cls("all")
        if kind == "latest" and body is not None:
            count = body.get("num_versions", 1)
            if type(count) is int and count >= 1:
                return cls("latest", count)
        if kind == "specific" and body is not None:
            listed = body.get("versions")
            if isinstance(listed, list) and listed and all(type(number) is int and number >= 1 for number in listed):
                return cls("specific", versions=tuple(sorted(listed)))
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
    """Whether ``root`` is one artifact directory, not a repository.

    Args:
        root: the directory ``irpe serve`` was given.

    Returns:
        True when it holds model.json.
    """
    return (root / "model.json").is_file()


def _plain_name(root: Path) -> str:
    try:
        name = json.loads((root / "model.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and name else root.name


def read_config(model_dir: Path) -> ModelConfig:
    """A model's ``config.json``.

    Args:
        model_dir: ``<repo>/<model>``.

    Returns:
        Its config (the defaults when there is no config.json).

    Raises:
        RepositoryError: config.json is not valid JSON, not an object, or holds a bad policy or max_queue.
    """
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
    """Version number -> directory, for the sub-directories named by a positive ASCII number."""
    out = {}
    for child in model_dir.iterdir():
        if child.is_dir() and child.name.isascii() and child.name.isdigit() and int(child.name) >= 1:
            out[int(child.name)] = child
    return out


def scan(root: Path) -> dict[str, ModelDir]:
    """Every model under ``root``.

    Args:
        root: a model repository, or a plain artifact directory (one model, version 1).

    Returns:
        model name -> what is on disk for it (a config.json that cannot be read: in ``error``).

    Raises:
        RepositoryError: ``root`` is not a directory.
    """
    if is_plain_artifact(root):
        return {(name := _plain_name(root)): ModelDir(name, ModelConfig(), {1: root})}
    if not root.is_dir():
        raise RepositoryError(f"{root}: no such directory; pass an artifact directory (with model.json) or a "
                              "model repository (<model>/<version>/model.json)")
    models = {}
    for model_dir in sorted(root.iterdir()):
        if not model_dir.is_dir() or model_dir.name.startswith("."):
            continue
        try:
            models[model_dir.name] = ModelDir(model_dir.name, read_config(model_dir), _versions(model_dir))
        except RepositoryError as e:
            models[model_dir.name] = ModelDir(model_dir.name, ModelConfig(), _versions(model_dir), error=str(e))
    return models


def check_layout(root: Path) -> dict[str, ModelDir]:
    """:func:`scan`, refusing a repository without a single ``<model>/<version>/`` directory.

    Args:
        root: what ``irpe serve`` was given.

    Returns:
        As :func:`scan`.

    Raises:
        RepositoryError: ``root`` is neither an artifact directory nor a repository with a version.
    """
    models = scan(root)
    if not any(model.versions for model in models.values()):
        raise RepositoryError(f"{root}: neither an artifact directory (no model.json: write one with `irpe export`) "
                              "nor a model repository (no <model>/<version>/ directories, version = a positive "
                              "integer); see docs/serving.md, 'Model repository'")
    return models


def signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """What tells a rewritten version from the one loaded.

    Args:
        path: a version directory.

    Returns:
        (name, size, mtime in ns) of every file in it, by name; empty when it is not a directory.
    """
    out = []
    for child in sorted(path.iterdir()) if path.is_dir() else []:
        if child.is_file():
            stat = child.stat()
            out.append((child.name, stat.st_size, stat.st_mtime_ns))
    return tuple(out)
