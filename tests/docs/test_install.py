"""After ``pip install .`` (not editable), Python and ``irpe`` run from the repository root use the installed
package: nothing in the checkout's root shadows it (tests/docs/install.py builds the install)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.docs.install import REPO, Installed

IMPORTS = ("import irpe, irpe.artifact, irpe.server\n"
           "from irpe.artifact.builtin import builtin_artifact\n"
           "print(irpe.__file__, irpe.artifact.__file__, irpe.server.__file__, builtin_artifact('digits'), sep='\\n')")


def _python(installed: Installed, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(installed.python), "-c", code], cwd=cwd, env=installed.env(), capture_output=True,
                          text=True, timeout=60)


def test_the_package_imports_from_the_repository_root(installed: Installed) -> None:
    done = _python(installed, IMPORTS, REPO)
    assert done.returncode == 0, done.stderr
    paths = [Path(line) for line in done.stdout.splitlines()]
    assert len(paths) == 4 and all(path.is_relative_to(installed.site_packages) for path in paths), paths
    assert {p.name for p in paths[3].iterdir()} >= {"model.json", "model.onnx"}  # docs/deploy/docker.md copies it


def test_the_irpe_command_runs_from_the_repository_root(installed: Installed) -> None:
    done = subprocess.run(["irpe", "--version"], cwd=REPO, env=installed.env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("irpe "), done.stdout


def test_a_folder_named_irpe_in_the_working_directory_is_what_would_break_it(installed: Installed,
                                                                            tmp_path: Path) -> None:
    """The check above can fail: a top-level ``irpe/`` where Python runs hides the installed package."""
    (tmp_path / "irpe").mkdir()
    (tmp_path / "irpe" / "__init__.py").write_text("")
    done = _python(installed, IMPORTS, tmp_path)
    assert done.returncode != 0 and "No module named 'irpe.artifact'" in done.stderr, done.stderr

