"""Artifacts that ship inside the package, served by name (``irpe serve digits``).

``digits``: the embedded default model, trained by ``irpe quickstart --retrain`` on scikit-learn's
digits (how, with which seed and project version: ``model.json``'s ``training`` block).
"""

from __future__ import annotations

from pathlib import Path

BUILTIN_DIR = Path(__file__).with_name("builtin")
BUILTINS = ("digits",)


def builtin_artifact(name: str) -> Path:
    """The directory of an artifact shipped inside the package.

    Args:
        name: one of :data:`BUILTINS`.

    Returns:
        The artifact directory.

    Raises:
        ValueError: ``name`` is not a builtin (the choices are named).
        FileNotFoundError: the installation lacks the artifact's model.json.
    """
    if name not in BUILTINS:
        raise ValueError(f"{name!r} is not a builtin artifact; choose one of {', '.join(BUILTINS)} "
                         "or pass a directory written by `irpe export`")
    path = BUILTIN_DIR / name
    if not (path / "model.json").is_file():
        raise FileNotFoundError(f"{path}: the builtin {name!r} artifact is missing from this installation; "
                                "reinstall irpe-deploy or run `irpe quickstart --retrain`")
    return path


def resolve_artifact_dir(spec: str | Path) -> Path:
    """The artifact directory ``spec`` means.

    Args:
        spec: a directory, or the name of a builtin artifact.

    Returns:
        ``spec`` as a path, or the builtin's directory when ``spec`` names one and no such path exists.

    Raises:
        FileNotFoundError: ``spec`` names a builtin that the installation lacks.
    """
    path = Path(spec)
    if str(spec) in BUILTINS and not path.exists():
        return builtin_artifact(str(spec))
    return path
