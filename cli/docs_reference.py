"""Writes docs/cli.md, docs/configuration.md and docs/api/python.md from the code, so the pages cannot drift.

docs/cli.md comes from the ``irpe`` argparse parser (every command: usage, each flag with its help, default
and choices); docs/configuration.md from ``irpe serve``'s ``Settings`` (flag, ``IRPE_*`` variable, default,
meaning) and from :data:`irpe.environment.VARIABLES` (the variables that are not settings); docs/api/python.md
from the docstrings and signatures of the library functions the guides import (:mod:`irpe.api_reference`).

Run ``.venv/bin/python -m irpe.docs_reference`` after adding or changing a flag, a setting or a variable;
with ``--check`` it writes nothing, prints what is stale or missing and exits 1.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import re
import sys
import textwrap
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REGENERATE = ".venv/bin/python -m irpe.docs_reference"
DOCS = Path(__file__).resolve().parents[1] / "docs"
GENERATED = f"Generated from the code by `{REGENERATE}`; do not edit by hand."
PAGES = ("cli.md", "configuration.md", "api/python.md")  # under docs/
_VARIABLE = re.compile(r"\bIRPE_[A-Z][A-Z0-9_]*[A-Z0-9]\b")


@dataclass(frozen=True)
class Command:
    """A leaf command of ``irpe``: its words after ``irpe``, its parser and its one-line summary."""

    words: tuple[str, ...]
    parser: argparse.ArgumentParser
    summary: str

    @property
    def name(self) -> str:
        """``irpe bench cpu``."""
        return " ".join(("irpe", *self.words))


def commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[Command]:
    """Every leaf command under ``parser``, in the order ``irpe --help`` lists them.

    Args:
        parser: the ``irpe`` parser (or a command group's).
        words: the command words that lead to ``parser``.

    Returns:
        One :class:`Command` per command that runs something (``irpe bench`` itself is a group, not listed).
    """
    found: list[Command] = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, child in action.choices.items():
            if any(isinstance(a, argparse._SubParsersAction) for a in child._actions):
                found += commands(child, (*words, name))
            else:
                found.append(Command((*words, name), child, summaries.get(name, "")))
    return found


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help of ``action`` as ``--help`` prints it (``%(default)s`` expanded), on one line."""
    raw = parser._get_formatter()._expand_help(action) if action.help else ""
    return " ".join(raw.split())


def _takes_no_value(action: argparse.Action) -> bool:
    return action.nargs == 0


def _states_default_itself(action: argparse.Action) -> bool:
    """True where argparse's default says nothing: no default, not required, and a value to give."""
    return (action.default is None and not action.required and action.nargs not in ("+", "*")
            and not _takes_no_value(action) and not isinstance(action, argparse._AppendAction))


def flags_without_help(parser: argparse.ArgumentParser) -> list[str]:
    """``irpe CMD --flag`` for each flag or argument of each command that has no help text."""
    return [f"{command.name} {_label(action)}" for command in commands(parser)
            for action in _options(command.parser) if not (action.help or "").strip()]


def flags_without_default(parser: argparse.ArgumentParser) -> list[str]:
    """``irpe CMD --flag`` for each flag whose argparse default is None and whose help does not say its default."""
    return [f"{command.name} {_label(action)}" for command in commands(parser)
            for action in _options(command.parser)
            if _states_default_itself(action) and "default" not in (action.help or "")]


def _label(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


def _metavar(action: argparse.Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    return action.dest.upper()


def _invocation(action: argparse.Action) -> str:
    """``-o``, ``--output OUTPUT``; a positional: ``IMAGES ...``."""
    if not action.option_strings:
        value = _metavar(action)
        return {"?": f"[{value}]", "+": f"{value} ...", "*": f"[{value} ...]"}.get(str(action.nargs), value)
    value = "" if _takes_no_value(action) else f" {_metavar(action)}"
    return ", ".join(f"`{flag}`" for flag in action.option_strings[:-1]) + \
        (", " if len(action.option_strings) > 1 else "") + f"`{action.option_strings[-1]}{value}`"


def usage(command: Command) -> str:
    """``irpe export CHECKPOINT -o OUTPUT [options]``: the positionals, the required flags, then the rest."""
    actions = _options(command.parser)
    parts = [command.name, *(_invocation(a) for a in actions if not a.option_strings)]
    parts += [f"{a.option_strings[0]} {_metavar(a)}" for a in actions if a.option_strings and a.required]
    if any(a.option_strings and not a.required for a in actions):
        parts.append("[options]")
    return " ".join(parts)


def _default(action: argparse.Action) -> str:
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        return "required"
    if action.default is None or action.default is argparse.SUPPRESS or action.default == []:
        return ""
    if _takes_no_value(action) and action.default is False:
        return "off"
    return f"`{action.default}`"


def escape(text: str) -> str:
    """Markdown for a table cell: ``|`` always, and ``<``, ``>``, ``*`` outside code spans, escaped."""
    pieces = text.split("`")
    for i in range(0, len(pieces), 2):  # even pieces lie outside backticks
        pieces[i] = re.sub(r"([<>*])", r"\\\1", pieces[i])
    return "`".join(pieces).replace("|", "\\|")


def _table(parser: argparse.ArgumentParser, actions: Sequence[argparse.Action]) -> list[str]:
    rows = ["| option | default | choices | meaning |", "| --- | --- | --- | --- |"]
    for action in actions:
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        option = _invocation(action) if action.option_strings else f"`{_invocation(action)}`"
        rows.append(f"| {option} | {_default(action)} | {choices} | "
                    f"{escape(help_text(parser, action))} |")
    return rows


def _command_section(command: Command) -> list[str]:
    parser = command.parser
    summary = command.summary[:1].upper() + command.summary[1:]
    lines = [f"## {command.name}", "", escape(summary) + ".", ""]
    if parser.description:
        lines += [escape(" ".join(parser.description.split())), ""]
    lines += ["```text", usage(command), "```", ""]
    groups = [parser._positionals, parser._optionals] + \
        [g for g in parser._action_groups if g not in (parser._positionals, parser._optionals)]
    main = [a for g in groups[:2] for a in g._group_actions if a in _options(parser)]
    if main:
        lines += _table(parser, main) + [""]
    for group in groups[2:]:
        actions = [a for a in group._group_actions if a in _options(parser)]
        if actions:
            lines += [f"**{escape(group.title or '')}**", ""] + _table(parser, actions) + [""]
    return lines


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def render_cli(parser: argparse.ArgumentParser | None = None) -> str:
    """docs/cli.md: every command of ``parser`` (default: the ``irpe`` parser).

    Args:
        parser: the parser to document; None builds ``irpe``'s.

    Returns:
        The page's Markdown.
    """
    from irpe.cli import DESCRIPTION, build_parser

    parser = parser or build_parser()
    found = commands(parser)
    lines = ["# Command line reference", "", GENERATED, "", DESCRIPTION, "",
             "`irpe --version` prints the version; `irpe --help` and `irpe COMMAND --help` print help. "
             "`irpe serve` also reads each of its settings from an `IRPE_*` variable: "
             "[configuration.md](configuration.md).", "", "| command | what it does |", "| --- | --- |"]
    lines += [f"| [{c.name}](#{_anchor(c.name)}) | {escape(c.summary)} |" for c in found]
    lines.append("")
    for command in found:
        lines += _command_section(command)
    return "\n".join(lines).rstrip("\n") + "\n"


def field_comments(cls: type) -> dict[str, str]:
    """The end-of-line comment of each dataclass field of ``cls`` (fields without one are left out)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    return {node.target.id: comments[node.end_lineno] for node in body.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
            and node.end_lineno in comments}


def _setting_value(value: object) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    return f"`{value}`" if value != "" else "empty"


@dataclass(frozen=True)
class SettingRow:
    """One row of the settings table."""

    name: str
    flag: str
    variable: str
    default: str
    meaning: str


def setting_rows() -> list[SettingRow]:
    """A row per ``Settings`` field: its ``irpe serve`` flag's help, else its comment, as its meaning.

    Raises:
        ValueError: for a field with neither a flag nor a comment (naming the field and the fix).
    """
    from irpe.cli import build_parser
    from irpe.server.config import Settings

    serve = next(c for c in commands(build_parser()) if c.words == ("serve",))
    by_dest = {a.dest: a for a in _options(serve.parser)}
    comments = field_comments(Settings)
    rows, undocumented = [], []
    for field in dataclasses.fields(Settings):
        action = by_dest.get(field.name)
        meaning = help_text(serve.parser, action) if action is not None and action.help else comments.get(field.name)
        if not meaning:
            undocumented.append(field.name)
            continue
        flag = "variable only" if action is None else (f"`{action.option_strings[-1]}`" if action.option_strings
                                          else f"`{_metavar(action)}` (argument)")
        rows.append(SettingRow(field.name, flag, f"`IRPE_{field.name.upper()}`", _setting_value(field.default),
                               meaning))
    if undocumented:
        raise ValueError(f"Settings field(s) {undocumented} have neither an irpe serve flag with help nor an "
                         "end-of-line comment in server/config.py: add one, then run " + REGENERATE)
    return rows


def render_configuration() -> str:
    """docs/configuration.md: ``irpe serve``'s settings, then the other environment variables.

    Returns:
        The page's Markdown.
    """
    from irpe.environment import VARIABLES

    lines = ["# Configuration", "", GENERATED, "", "## `irpe serve` settings", "",
             "`irpe serve` takes each setting from its flag, else from its `IRPE_*` variable, else its default. "
             "Boolean variables take 1/0, true/false, yes/no or on/off; `IRPE_FRONTENDS` also takes `auto`. "
             "A default of 0 or -1 means what the flag's help says (often: chosen from the machine). "
             "The other commands take flags only ([cli.md](cli.md)).", "",
             "| setting | flag | variable | default | meaning |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r.name} | {r.flag} | {r.variable} | {r.default} | {escape(r.meaning)} |" for r in setting_rows()]
    lines += ["", "## Other environment variables", "",
              "Read by the commands named; a flag, where there is one, wins over the variable.", "",
              "| variable | default | flag | read by | meaning |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{v.name}` | {escape(v.default)} | {escape(v.flag)} | {escape(v.read_by)} | {escape(v.meaning)} |"
              for v in VARIABLES]
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """``{file name under docs/: its generated text}``."""
    from irpe.api_reference import render_python_api

    return dict(zip(PAGES, (render_cli(), render_configuration(), render_python_api(GENERATED)), strict=True))


def stale_pages(docs: Path = DOCS) -> list[str]:
    """The generated pages whose file under ``docs`` is missing or differs from what the code gives now."""
    out = []
    for name, text in pages().items():
        path = docs / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(f"docs/{name}")
    return out


def variables_in(files: Iterable[Path]) -> dict[str, list[Path]]:
    """``{variable name: files that mention it}`` over ``files`` (reads, messages and docstrings alike)."""
    found: dict[str, list[Path]] = {}
    for path in files:
        for name in sorted(set(_VARIABLE.findall(path.read_text(encoding="utf-8")))):
            found.setdefault(name, []).append(path)
    return found


def documented_variables() -> set[str]:
    """Every ``IRPE_*`` name docs/configuration.md lists: the settings' and irpe.environment's."""
    from irpe.environment import VARIABLES
    from irpe.server.config import Settings

    return {f"IRPE_{f.name.upper()}" for f in dataclasses.fields(Settings)} | {v.name for v in VARIABLES}


def main(argv: Sequence[str] | None = None) -> int:
    """Write the pages (or, with ``--check``, report what is stale or missing and exit 1)."""
    parser = argparse.ArgumentParser(prog="python -m irpe.docs_reference", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    parser.add_argument("--docs", type=Path, default=DOCS, help=f"the docs folder (default {DOCS})")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.docs)
        for name in stale:
            print(f"{name} is stale: run {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for name, text in pages().items():
        (args.docs / name).parent.mkdir(parents=True, exist_ok=True)
        (args.docs / name).write_text(text, encoding="utf-8")
        print(args.docs / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
