"""irpe-deploy: export and serve vision transformers with image relative position encoding."""

from typing import Any


def __getattr__(name: str) -> Any:
    """``irpe.__version__``: the package version, read when first asked for (irpe.version)."""
    if name == "__version__":
        from irpe.version import package_version

        version = package_version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'irpe' has no attribute {name!r}")
