"""The version of irpe-deploy: the installed distribution's, else the one in a source tree's pyproject.toml."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "irpe-deploy"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
UNKNOWN = "0+unknown"
_PROJECT_VERSION = re.compile(r'^\[project\]\s*$(?:(?!^\[).)*?^version\s*=\s*"([^"]+)"', re.M | re.S)


def pyproject_version(path: Path = PYPROJECT) -> str | None:
    """The ``version`` of the ``[project]`` table in ``path``.

    Args:
        path: a pyproject.toml file.

    Returns:
        The version string, or None when the file is unreadable or has no ``[project]`` version.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    match = _PROJECT_VERSION.search(text)
    return match.group(1) if match else None


def package_version() -> str:
    """The installed distribution's version (importlib.metadata), else pyproject.toml's, else ``0+unknown``.

    Returns:
        A version string such as ``0.1.0``.
    """
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return pyproject_version() or UNKNOWN
