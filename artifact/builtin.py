"""Artifacts that ship inside the package, served by name (``irpe serve digits``).

``digits``: the embedded default model, trained by ``irpe quickstart --retrain`` on scikit-learn's
digits (how, with which seed and project version: ``model.json``'s ``training`` block).
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_DIR = Path(__file__).with_name("builtin")
BUILTINS = ("digits",)


def builtin_artifact(name: str) -> Path:
    """The directory of the shipped artifact ``name``; ValueError naming the choices otherwise."""
    if name not in BUILTINS:
        raise ValueError(f"{name!r} is not a builtin artifact; choose one of {', '.join(BUILTINS)} "
                         "or pass a directory written by `irpe export`")
    path = BUILTIN_DIR / name
    if not (path / "model.json").is_file():
        raise FileNotFoundError(f"{path}: the builtin {name!r} artifact is missing from this installation; "
                                "reinstall irpe-deploy or run `irpe quickstart --retrain`")
    return path


def resolve_artifact_dir(spec: str | Path) -> Path:
    """``spec`` as a directory, or the builtin artifact it names when no such directory exists."""
    path = Path(spec)
    if str(spec) in BUILTINS and not path.exists():
        return builtin_artifact(str(spec))
    return path
