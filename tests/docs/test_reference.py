"""docs/cli.md and docs/configuration.md are what the code generates; every flag has help; every ``IRPE_*``
variable the package mentions is documented. A failure names the command that regenerates the pages."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import pytest

from irpe.cli import build_parser
from irpe.docs_reference import (
    DOCS,
    PAGES,
    REGENERATE,
    commands,
    documented_variables,
    escape,
    field_comments,
    flags_without_default,
    flags_without_help,
    main,
    pages,
    render_cli,
    variables_in,
)

ROOT = Path(__file__).resolve().parents[2]
FIX = f"run `{REGENERATE}` and commit docs/cli.md, docs/configuration.md and docs/api/python.md"


def package_files() -> list[Path]:
    """Every .py file of the irpe package, from pyproject.toml's package-dir (the folders it maps)."""
    import tomllib

    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    folders = sorted({ROOT / folder for folder in package_dir.values()})
    tops = [f for f in folders if not any(other in f.parents for other in folders)]
    return sorted(path for folder in tops for path in folder.rglob("*.py"))


@pytest.mark.parametrize("name", PAGES)
def test_generated_page_is_up_to_date(name):
    path = DOCS / name
    assert path.is_file(), f"docs/{name} is missing: {FIX}"
    want, have = pages()[name], path.read_text(encoding="utf-8")
    diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), f"docs/{name}",
                                             "generated", n=0))[:24])
    assert have == want, f"docs/{name} is stale (a flag, setting or variable changed): {FIX}\n{diff}"


def test_every_flag_of_every_command_has_help():
    missing = flags_without_help(build_parser())
    assert not missing, f"give these a one-line help= (then {FIX}): {missing}"


def test_every_flag_whose_argparse_default_is_none_says_its_default_in_its_help():
    missing = flags_without_default(build_parser())
    assert not missing, f"say '(default ...)' in the help of (then {FIX}): {missing}"


def test_every_irpe_variable_the_package_mentions_is_documented():
    mentioned = variables_in(package_files())
    undocumented = {name: [str(p.relative_to(ROOT)) for p in files] for name, files in mentioned.items()
                    if name not in documented_variables()}
    assert not undocumented, (f"IRPE_* variables read or named in the package but not documented: {undocumented}; "
                              f"add a row to VARIABLES in cli/environment.py (or a Settings field), then {FIX}")
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert [name for name in mentioned if f"`{name}`" not in page] == [], FIX


def test_the_variable_scan_sees_reads_settings_and_messages():
    mentioned = variables_in(package_files())
    reads = {"IRPE_DATA_DIR", "IRPE_CUDA_DEVICE", "IRPE_DEBUG", "IRPE_CACHE", "IRPE_OFFLINE", "IRPE_ORT_OPS"}
    assert reads | {"IRPE_API_KEY", "IRPE_ADMIN_KEY", "IRPE_INSECURE"} <= set(mentioned)
    assert "IRPE_X" not in mentioned and "IRPE_ARTIFACT_DIR" in documented_variables()


def test_cli_page_lists_every_command_and_flag():
    text = render_cli()
    found = commands(build_parser())
    assert {c.name for c in found} >= {"irpe serve", "irpe export", "irpe bench cpu", "irpe classify"}
    for command in found:
        section = text.split(f"\n## {command.name}\n", 1)[1].split("\n## ", 1)[0]
        for action in command.parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section, f"{command.name} {flag} missing from its section"


def test_check_mode_names_stale_pages_and_the_fix(tmp_path, capsys):
    for name, text in pages().items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert main(["--check", "--docs", str(tmp_path)]) == 0
    (tmp_path / "cli.md").write_text("edited by hand\n", encoding="utf-8")
    assert main(["--check", "--docs", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "docs/cli.md is stale" in err and REGENERATE in err and "configuration.md" not in err
    assert main(["--docs", str(tmp_path)]) == 0
    assert main(["--check", "--docs", str(tmp_path)]) == 0


@dataclass
class _Commented:
    plain: int = 1  # the plain one
    hashed: str = "#not a comment"  # after a string holding '#'
    bare: float = 0.0
    spread: tuple = (1,
                     2)  # on the last line of the field


def test_field_comments_are_the_end_of_line_comments():
    assert field_comments(_Commented) == {"plain": "the plain one", "hashed": "after a string holding '#'",
                                          "spread": "on the last line of the field"}


def test_escape_keeps_code_spans_and_tables_intact():
    assert escape("a|b <key> `x<y>` IRPE_* `p|q`") == r"a\|b \<key\> `x<y>` IRPE_\* `p\|q`"
