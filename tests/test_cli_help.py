"""``irpe --version`` and ``irpe --help``: the package version, and help written for users."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from irpe.cli import build_parser
from irpe.version import package_version, pyproject_version

ROOT = Path(__file__).resolve().parents[1]


def _irpe(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200")  # one line per command
    return subprocess.run([sys.executable, "-m", "irpe", *argv], capture_output=True, text=True, timeout=60, env=env)


def test_version_prints_the_installed_package_version():
    res = _irpe("--version")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"irpe {metadata.version('irpe-deploy')}"


def test_version_falls_back_to_pyproject(tmp_path):
    assert pyproject_version(ROOT / "pyproject.toml") == package_version()
    other = tmp_path / "pyproject.toml"
    other.write_text('[build-system]\nversion = "9"\n\n[project]\nname = "x"\nversion = "2.3.4"\n\n[tool.y]\n'
                     'version = "7"\n')
    assert pyproject_version(other) == "2.3.4"
    other.write_text('[project]\nname = "x"\n\n[tool.y]\nversion = "7"\n')
    assert pyproject_version(other) is None
    assert pyproject_version(tmp_path / "missing.toml") is None


def test_help_speaks_to_users_and_lists_every_command_once():
    res = _irpe("--help")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "vision transformers with image relative position encoding" in text
    assert "docs/cli.md" in text and "--version" in text
    assert "parses arguments" not in text and "library functions" not in text  # not the module docstring
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for choice in sub._choices_actions:
        assert choice.help and "\n" not in choice.help
        assert sum(line.split() == [choice.dest, *choice.help.split()] for line in text.splitlines()) == 1, \
            choice.dest
