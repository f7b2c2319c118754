"""docs/api/python.md from the code: the library functions and classes the guides import, with their signatures
and docstrings, so the page cannot drift from them.

:data:`API` lists them by the import path the guides use. ``python -m irpe.docs_reference`` writes the page with
docs/cli.md and docs/configuration.md (and ``--check`` reports it stale). Rendering imports ``irpe.models`` and
``irpe.export``, so it needs the ``export`` extra (torch), as the generator's other pages need the dev venv.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass

SECTIONS = ("Args", "Attributes", "Returns", "Yields", "Raises")
_SECTION = re.compile(rf"^({'|'.join(SECTIONS)}):\s*$")
_ENTRY = re.compile(r"^(\**[A-Za-z_][\w.]*)(?: \([^)]*\))?:\s*(.*)$")
_ROLE = re.compile(r":(?:func|class|data|meth|mod|attr):`~?([^`]+)`")  # reST roles -> code
_LITERAL = re.compile(r"``([^`]+)``")  # reST literals -> Markdown code
WIDTH = 100  # a signature longer than this is written one parameter per line


@dataclass(frozen=True)
class Entry:
    """One documented object: the module the guides import it from, its name, and the page's section."""

    module: str
    name: str
    section: str

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"

    def resolve(self) -> object:
        return getattr(importlib.import_module(self.module), self.name)


API = (
    Entry("irpe.artifact", "load_artifact", "Artifacts"),
    Entry("irpe.artifact", "ModelArtifact", "Artifacts"),
    Entry("irpe.artifact", "Preprocess", "Artifacts"),
    Entry("irpe.artifact.preprocess", "preprocess_image", "Artifacts"),
    Entry("irpe.artifact.builtin", "builtin_artifact", "Artifacts"),
    Entry("irpe.models", "list_models", "Models"),
    Entry("irpe.models", "create_model", "Models"),
    Entry("irpe.export", "export_artifact", "Export"),
    Entry("irpe.export", "ExportOptions", "Export"),
)
INTRO = {
    "Artifacts": "`irpe.artifact` is torch-free: the base install (`pip install .`) has it, as the server does.",
    "Models": "`irpe.models` needs torch: `pip install '.[export]'` (or `'.[train]'`) from the checkout's root.",
    "Export": "`irpe.export` needs the `export` extra: `pip install '.[export]'` from the checkout's root.",
}


def signature(obj: object, name: str) -> str:
    """``name(params) -> return`` as the source writes the annotations, one parameter per line when long.

    Args:
        obj: a function or a (data)class.
        name: the name to show.

    Returns:
        The signature text.
    """
    sig = inspect.signature(obj)  # type: ignore[arg-type]
    if inspect.isclass(obj):
        sig = sig.replace(return_annotation=inspect.Signature.empty)
    params = [_parameter(obj, p) for p in sig.parameters.values()]
    tail = "" if sig.return_annotation is inspect.Signature.empty else f" -> {_text(sig.return_annotation)}"
    flat = f"{name}({', '.join(params)}){tail}"
    return flat if len(flat) <= WIDTH else f"{name}(\n" + "".join(f"    {p},\n" for p in params) + f"){tail}"


def _text(annotation: object) -> str:
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _parameter(obj: object, param: inspect.Parameter) -> str:
    """One parameter as source text; a dataclass field's default factory is shown as its value."""
    text = param.name if param.annotation is inspect.Parameter.empty else f"{param.name}: {_text(param.annotation)}"
    text = {param.VAR_POSITIONAL: "*", param.VAR_KEYWORD: "**"}.get(param.kind, "") + text
    default = param.default
    if dataclasses.is_dataclass(obj) and default is dataclasses.MISSING:
        default = inspect.Parameter.empty
    fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
    field = fields.get(param.name)
    if field is not None and field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    if default is inspect.Parameter.empty:
        return text
    return f"{text} = {default!r}"


def render_docstring(doc: str) -> list[str]:
    """A Google-style docstring as Markdown: the text as paragraphs, each section a bold title and a list.

    Args:
        doc: the cleaned docstring (``inspect.getdoc``).

    Returns:
        The Markdown lines.
    """
    out: list[str] = []
    section = ""
    for line in doc.splitlines():
        match = _SECTION.match(line)
        if match:
            section = match.group(1)
            while out and not out[-1].strip():
                out.pop()
            out += ["", f"**{section}**", ""]
        elif section in ("Returns", "Yields") and line.startswith("    ") and out[-1].startswith("- "):
            out[-1] += " " + line.strip()  # free text: one item
        elif section and line.startswith("    ") and not line.startswith("        "):
            entry = _ENTRY.match(line.strip())
            body = f"`{entry.group(1)}`: {entry.group(2)}" if entry and section != "Returns" else line.strip()
            out.append(f"- {body}")
        elif section and line.startswith("        ") and out and out[-1].startswith("- "):
            out[-1] += " " + line.strip()
        else:
            section = "" if not line.strip() else section
            out.append(line)
    return [_LITERAL.sub(r"`\1`", _ROLE.sub(r"`\1`", line)) for line in out]


def render_entry(entry: Entry) -> list[str]:
    """The page's part for one object: heading, import line, signature and docstring."""
    obj = entry.resolve()
    kind = "class" if inspect.isclass(obj) else "function"
    doc = inspect.getdoc(obj) or ""
    return [f"### `{entry.path}`", "", f"{kind}; `from {entry.module} import {entry.name}`", "",
            "```python", signature(obj, entry.name), "```", "", *render_docstring(doc), ""]


def render_python_api(generated: str) -> str:
    """docs/api/python.md.

    Args:
        generated: the line that says how the page is made (docs_reference's).

    Returns:
        The page's text.
    """
    lines = ["# Python API", "", generated, "",
             "The functions and classes the guides import: load an artifact and run its preprocessing without "
             "torch, build a model, export a checkpoint. Everything else in the package is internal and may change.",
             ""]
    for section in dict.fromkeys(e.section for e in API):
        lines += [f"## {section}", "", INTRO[section], ""]
        for entry in (e for e in API if e.section == section):
            lines += render_entry(entry)
    return "\n".join(lines).rstrip("\n") + "\n"
