"""A non-editable install of the checkout, as a reader's ``pip install .`` makes, for the docs' commands.

One build per test session (the ``installed`` fixture in tests/docs/conftest.py): the checkout's files
(tracked, and untracked ones git does not ignore: what a clone holds, plus work not yet committed) are copied
to a temporary folder and installed with ``pip install --no-deps --no-build-isolation`` into a fresh venv.
That venv finds the dependencies through a ``.pth`` line naming the test venv's site-packages; ``.pth`` files
are read only in a site directory, so the test venv's editable finder is never loaded and ``irpe`` is the
installed copy or nothing. Commands then run from the repository root (or with the root first on
``sys.path``), where a top-level folder named ``irpe`` would shadow the install. The build takes about 3 s
(the two C extensions compile).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 300  # ~3 s here; the margin is for a machine busy with other work


@dataclass(frozen=True)
class Installed:
    """A venv holding a non-editable install of the checkout."""

    venv: Path
    site_packages: Path
    build_s: float

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a command of the docs runs in: this venv's ``bin`` first on PATH, no IRPE_* settings
        (they would change the server under test) and no PYTHONPATH but the ones in ``extra``.

        Args:
            extra: variables to set on top.

        Returns:
            The environment.
        """
        env = {k: v for k, v in os.environ.items() if not k.startswith("IRPE_") and k != "PYTHONPATH"}
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env


def checkout_files(repo: Path) -> list[str]:
    """The files of the checkout a build may use: tracked, and untracked ones git does not ignore.

    Args:
        repo: the repository root.

    Returns:
        Their paths relative to ``repo``, existing files only (a deletion not yet committed is left out).
    """
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return [name for name in listed if name and (repo / name).is_file()]


def install_checkout(repo: Path, into: Path) -> Installed:
    """Install ``repo`` non-editably into a fresh venv under ``into`` (see the module docstring).

    Args:
        repo: the repository root.
        into: an empty folder for the source copy and the venv.

    Returns:
        The venv.

    Raises:
        subprocess.CalledProcessError: venv creation or the install failed (its output in the exception).
    """
    start = time.perf_counter()
    source = into / "source"
    for name in checkout_files(repo):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, source / name)
    venv = into / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_test_venv_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # --ignore-installed: the test venv's editable irpe-deploy is visible through the .pth line; never touch it
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "--ignore-installed", str(source)], check=True, capture_output=True, text=True,
                   timeout=BUILD_TIMEOUT_S, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return Installed(venv, site, time.perf_counter() - start)
