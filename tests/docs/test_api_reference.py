"""docs/api/python.md (cli/api_reference.py): it documents every library object the guides import, each with a
docstring in the Args/Returns form; its staleness is checked with the other generated pages (test_reference.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from irpe.api_reference import API, render_docstring, signature
from irpe.docs_reference import DOCS, PAGES

ROOT = Path(__file__).resolve().parents[2]
_IMPORT = re.compile(r"from (irpe(?:\.\w+)*) import ([\w, ]+)")


def imported_in_docs() -> dict[str, list[str]]:
    """``{module.name: pages}`` for every ``from irpe... import ...`` in README.md and docs/ (generated pages aside)."""
    pages = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).as_posix() not in PAGES)]
    found: dict[str, list[str]] = {}
    for page in pages:
        for module, names in _IMPORT.findall(page.read_text(encoding="utf-8")):
            for name in (n.strip() for n in names.split(",") if n.strip()):
                found.setdefault(f"{module}.{name}", []).append(page.relative_to(ROOT).as_posix())
    return found


def test_the_page_is_generated() -> None:
    assert "api/python.md" in PAGES


def test_every_object_the_guides_import_is_on_the_page() -> None:
    documented = {entry.path for entry in API}
    missing = {path: pages for path, pages in imported_in_docs().items() if path not in documented}
    assert not missing, f"add these to irpe.api_reference.API and regenerate: {missing}"


def test_every_documented_object_says_what_it_takes_and_gives() -> None:
    for entry in API:
        obj = entry.resolve()
        doc = inspect.getdoc(obj) or ""
        assert doc, f"{entry.path} has no docstring"
        if inspect.isclass(obj):
            continue  # a dataclass documents its fields (Attributes) or its text does
        params = [p for p in inspect.signature(obj).parameters if p != "self"]
        assert not params or "Args:" in doc, f"{entry.path}: its docstring has no Args section"
        assert "Returns:" in doc, f"{entry.path}: its docstring has no Returns section"


def test_docstrings_become_markdown_lists() -> None:
    doc = ("Do it.\n\nArgs:\n    x: the ``input``, see :func:`irpe.f`\n        and more.\n    **kw: passed on.\n\n"
           "Returns:\n    A value that spans\n    two lines.\n\nRaises:\n    ValueError: when bad.")
    assert render_docstring(doc) == [
        "Do it.", "", "**Args**", "", "- `x`: the `input`, see `irpe.f` and more.", "- `**kw`: passed on.", "",
        "**Returns**", "", "- A value that spans two lines.", "", "**Raises**", "", "- `ValueError`: when bad."]


def test_long_signatures_are_one_parameter_per_line() -> None:
    def short(a: int, b: str = "x") -> None:
        """Short."""

    def long(first_parameter_name: int, second_parameter_name: str = "a default value", *,
             third_parameter_name: float = 1.0, **rest: object) -> dict[str, int]:
        """Long."""

    assert signature(short, "short") == "short(a: int, b: str = 'x') -> None"
    assert signature(long, "long").splitlines()[1:3] == ["    first_parameter_name: int,",
                                                         "    second_parameter_name: str = 'a default value',"]
    assert signature(long, "long").endswith("    **rest: object,\n) -> dict[str, int]")
