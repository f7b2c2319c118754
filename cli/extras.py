"""Which extra (``pip install '.[EXTRA]'`` from the checkout) provides a missing module: one CLI line instead of a
traceback.

The extras and their packages come from the installed distribution's metadata (``Requires-Dist: ...;
extra == "x"``), so a new extra in pyproject.toml is covered once the package is reinstalled. Only the
import names that differ from their distribution names are listed here.
"""

from __future__ import annotations

import importlib.util
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
    "grpc_health": "grpcio-health-checking",
    "grpc_reflection": "grpcio-reflection",
    "grpc": "grpcio",
    "google": "protobuf",
    "google.protobuf": "protobuf",
    "opentelemetry": "opentelemetry-sdk",
    "opentelemetry.exporter": "opentelemetry-exporter-otlp-proto-http",
}
# import prefix -> the extra that brings it, where its distribution sits in several extras with different parts
MODULE_EXTRA = {"tritonclient.grpc": "grpc", "tritonclient.http": "dev"}
# what a command needs first, when a package sits in several extras (torch: export and train)
COMMAND_EXTRA = {"export": "export", "train": "train", "bench": "export", "models": "export", "serve": "cpu",
                 "classify": "cpu", "visualize": "train", "quickstart": "train"}
# the extra a user is never told first while another extra brings the package
DEVELOPER_EXTRA = "dev"
# what ``irpe serve --grpc-port`` imports from the [grpc] extra
GRPC_MODULES = ("grpc", "google.protobuf", "tritonclient.grpc")
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


def _longest_prefix(module: str, table: dict[str, str]) -> str | None:
    """The value of the longest dotted prefix of ``module`` in ``table`` (None when no prefix is listed)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in table:
            return table[prefix]
    return None


def extras_for_module(module: str) -> tuple[str, list[str]]:
    """The distribution that provides an import name and the extras that install it.

    Args:
        module: the import name that failed, dotted or not (``grpc``, ``google.protobuf``).

    Returns:
        ``(distribution, extras)``; ``extras`` is empty when no extra of irpe-deploy installs it.
    """
    top = module.split(".")[0]
    dist = _longest_prefix(module, MODULE_TO_DISTRIBUTION) or top
    return dist, extras_by_distribution().get(_normalise(dist), [])


def _choose_extra(module: str, extras: list[str], command: str | None) -> str:
    """The extra to name: the module's own, else the command's, else the first one that is not for developers."""
    for wanted in (_longest_prefix(module, MODULE_EXTRA), COMMAND_EXTRA.get(command or "")):
        if wanted in extras:
            return wanted
    return next((e for e in extras if e != DEVELOPER_EXTRA), extras[0])


def missing_module_message(module: str, command: str | None = None) -> str | None:
    """One line naming the extra (or package) that provides ``module``; None for irpe's own modules."""
    top = module.split(".")[0]
    if top == "irpe":
        return None
    if top == "tensorrt":
        from irpe.plugins.tensorrt_plugin import missing_tensorrt_message

        return missing_tensorrt_message(f"irpe {command}" if command else "this command", f"no module {module!r}")
    dist, extras = extras_for_module(module)
    what = f"irpe {command}" if command else "this command"
    if not extras:
        return f"{what} needs the Python package {dist} (import {module!r} failed): pip install {dist}"
    extra = _choose_extra(module, extras, command)
    others = [e for e in extras if e != extra]
    also = f" (also in [{'], ['.join(others)}])" if others else ""
    return f"{what} needs {dist} (import {module!r} failed), from the [{extra}] extra{also}: {install_line(extra)}"


def install_line(extra: str) -> str:
    """How to install ``extra``: from the checkout, since irpe-deploy is on no package index.

    Args:
        extra: an extra of pyproject.toml (``export``, ``grpc``, ...).

    Returns:
        ``pip install '.[EXTRA]' from the irpe-deploy checkout's root``.
    """
    return f"pip install '.[{extra}]' from the {DISTRIBUTION} checkout's root"


def require_modules(modules: tuple[str, ...]) -> None:
    """Check that each of ``modules`` can be imported, without importing it (its parent package is imported).

    Args:
        modules: import names, dotted or not, that a feature needs (``grpc``, ``tritonclient.grpc``).

    Raises:
        ModuleNotFoundError: for the first missing one, with ``name`` set, so the CLI names its extra.
    """
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError as e:  # a missing parent package
            raise ModuleNotFoundError(str(e), name=e.name or module) from None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
