"""tests/docs's fixtures: the checkout installed non-editably (tests/docs/install.py), once per session."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs.install import REPO, Installed, install_checkout


@pytest.fixture(scope="session")
def installed() -> Iterator[Installed]:
    """The checkout installed non-editably into a fresh venv, once per test session."""
    into = Path(tempfile.mkdtemp(prefix="irpe-install-"))
    try:
        try:
            venv = install_checkout(REPO, into)
        except subprocess.CalledProcessError as error:
            pytest.fail(f"pip install . failed ({error.returncode}):\n{error.stdout}\n{error.stderr}")
        yield venv
    finally:
        shutil.rmtree(into, ignore_errors=True)
