"""Make the ``irpe`` package importable from a plain checkout, without installing it.

``python3 scripts/checkout_package.py DEST`` builds ``DEST/irpe``: a folder of symbolic links that maps
``irpe.*`` onto the checkout's top-level folders exactly as pyproject.toml's ``package-dir`` does
(``irpe.plugins`` -> ``plugins/``, ``irpe.export`` -> ``export/``, ...). With ``DEST`` on ``PYTHONPATH``,
``python -m irpe.plugins.gpu_check`` runs from the checkout, and so does every child interpreter it starts.
Nothing is compiled and nothing is written into the checkout. Prints ``DEST``.

Standard library only, Python 3.10 and later (pyproject.toml is read with ``tomllib`` where it exists, and
with a pattern for the one ``package-dir`` line otherwise).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {"__pycache__"}


def package_dirs(pyproject: Path) -> dict[str, str]:
    """pyproject.toml's ``[tool.setuptools] package-dir``: package name -> folder relative to the checkout.

    Args:
        pyproject: the checkout's pyproject.toml.

    Returns:
        The mapping, e.g. ``{"irpe": "cli", "irpe.plugins": "plugins", ...}``.

    Raises:
        ValueError: the file has no ``package-dir`` table.
    """
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        match = re.search(r"^package-dir\s*=\s*(\{.*?\})\s*$", text, flags=re.M)
        if match is None:
            raise ValueError(f"{pyproject} has no one-line package-dir table under [tool.setuptools]") from None
        return ast.literal_eval(match.group(1).replace(" = ", ": "))
    table = tomllib.loads(text).get("tool", {}).get("setuptools", {}).get("package-dir")
    if not table:
        raise ValueError(f"{pyproject} has no [tool.setuptools] package-dir table")
    return dict(table)


def _link_children(source: Path, target: Path) -> None:
    """A real folder ``target`` holding one link per entry of ``source`` (so sub-packages can be added)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        if entry.name not in SKIPPED and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)


def build(dest: Path, root: Path = ROOT) -> Path:
    """Build ``dest/<top package>`` from the checkout at ``root``.

    Args:
        dest: the folder to put on ``PYTHONPATH`` (created if missing).
        root: the checkout (holds pyproject.toml).

    Returns:
        ``dest``.

    Raises:
        FileNotFoundError: a folder named in ``package-dir`` is missing from the checkout.
        FileExistsError: ``dest`` already holds the package (use a new, empty folder).
    """
    mapping = package_dirs(root / "pyproject.toml")
    for name, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        source = (root / folder).resolve()
        if not (source / "__init__.py").is_file():
            raise FileNotFoundError(f"package-dir maps {name} to {source}, which has no __init__.py")
        target = dest.joinpath(*name.split("."))
        if "." not in name:
            if target.exists():
                raise FileExistsError(f"{target} exists already; give checkout_package.py a new, empty folder")
            _link_children(source, target)
            continue
        if target.is_symlink():
            target.unlink()
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source, target_is_directory=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    """Command line: ``checkout_package.py DEST``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder to build the package links in (put it on PYTHONPATH)")
    args = parser.parse_args(argv)
    print(build(args.dest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
