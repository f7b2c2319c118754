"""An importable copy of another commit of this repository, served beside the current code by the benches.

``import_tree(ref, out)`` extracts ``ref`` with ``git archive``, lays it out as the installed package is laid
out (``irpe/``, ``irpe/server``, ``irpe/artifact``, ...) and compiles its resize extension, so that
``PYTHONPATH=<tree>`` runs that commit's ``irpe serve`` with this interpreter and these dependencies.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sysconfig
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("artifact", "models", "export", "plugins", "server", "training", "bench")
SINGLE_PROCESS_BASELINE = "4802bdc1e6712b4599c0e5ad813de39aa926d62c"  # the last commit serving in one process only


def import_tree(ref: str, out: Path, repo: Path = REPO) -> Path | None:
    """``out`` holding commit ``ref`` as an import tree, or None (not a git checkout, unknown ref, no
    compiler for its C extension: the comparison would not be fair)."""
    try:
        data = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", ref], check=True,
                              capture_output=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    src = out / "src"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(src, filter="data")
    tree = out / "tree"
    shutil.copytree(src / "cli" if (src / "cli").is_dir() else src / "irpe", tree / "irpe")  # irpe is cli/ now
    for name in SUBPACKAGES:
        if (src / name).is_dir():
            shutil.copytree(src / name, tree / "irpe" / name)
    source = src / "artifact" / "_resample.c"
    if source.is_file() and not _compile(source, tree / "irpe" / "artifact"):
        return None
    return tree


def _compile(source: Path, dest: Path) -> bool:
    """Build the extension in place with the interpreter's compiler settings (as setup.py would)."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    target = dest / f"_resample{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = [*cc, "-O3", "-std=c99", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source),
           "-o", str(target)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return False
    return target.is_file()
