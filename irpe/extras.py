"""Which ``pip install 'irpe-deploy[EXTRA]'`` provides a missing module: one CLI line instead of a traceback.

The extras and their packages come from the installed distribution's metadata (``Requires-Dist: ...;
extra == "x"``), so a new extra in pyproject.toml is covered once the package is reinstalled. Only the
import names that differ from their distribution names are listed here.
"""

from __future__ import annotations

import re
from importlib import metadata

DISTRIBUTION = "irpe-deploy"
# import name -> distribution name, where they differ
MODULE_TO_DISTRIBUTION = {
    "skimage": "scikit-image",
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "cuda": "cuda-python",
    "multipart": "python-multipart",
    "prometheus_client": "prometheus-client",
}
# what a command needs first, when a package sits in several extras (torch: export and train)
COMMAND_EXTRA = {"export": "export", "train": "train", "bench": "export", "models": "export"}
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*;.*extra\s*==\s*['\"]([^'\"]+)['\"]")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras_by_distribution() -> dict[str, list[str]]:
    """``{normalised distribution: [extras that install it]}`` from the installed metadata ({} if absent)."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for req in requires:
        m = _REQ.match(req)
        if m:
            out.setdefault(_normalise(m.group(1)), []).append(m.group(2))
    return out


def extras_for_module(module: str) -> tuple[str, list[str]]:
    """(distribution, extras providing it) for a top-level import name."""
    top = module.split(".")[0]
    dist = MODULE_TO_DISTRIBUTION.get(top, top)
    return dist, extras_by_distribution().get(_normalise(dist), [])


def missing_module_message(module: str, command: str | None = None) -> str | None:
    """One line naming the extra (or package) that provides ``module``; None for irpe's own modules."""
    top = module.split(".")[0]
    if top == "irpe":
        return None
    if top == "tensorrt":
        from irpe.plugins.tensorrt_plugin import missing_tensorrt_message

        return missing_tensorrt_message(f"irpe {command}" if command else "this command", f"no module {module!r}")
    dist, extras = extras_for_module(top)
    what = f"irpe {command}" if command else "this command"
    if not extras:
        return f"{what} needs the Python package {dist} (import {module!r} failed): pip install {dist}"
    preferred = COMMAND_EXTRA.get(command or "")
    extra = preferred if preferred in extras else extras[0]
    others = [e for e in extras if e != extra]
    also = f" (also in [{'], ['.join(others)}])" if others else ""
    return (f"{what} needs {dist} (import {module!r} failed), from the [{extra}] extra{also}: "
            f"pip install '{DISTRIBUTION}[{extra}]'")
