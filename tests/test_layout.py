"""The one-way flow: checkpoint -> models -> export -> server; the artifact contract is torch-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package folder -> irpe subpackages (and third-party roots) it must never import
FORBIDDEN = {
    "models": {"irpe.export", "irpe.server", "irpe.training", "irpe.plugins"},
    "artifact": {"irpe.models", "irpe.export", "irpe.server", "irpe.training", "irpe.plugins", "torch"},
    "server": {"irpe.models", "irpe.export", "irpe.plugins", "irpe.training", "torch", "torchvision"},
}
_RELATIVE = {"models": "irpe.models", "artifact": "irpe.artifact", "server": "irpe.server"}


def _imports(path: Path, package: str) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # resolve "from ..x import y" against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
    return found


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_package_imports_respect_the_flow(folder):
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for mod in _imports(path, _RELATIVE[folder]):
            if any(mod == f or mod.startswith(f + ".") for f in FORBIDDEN[folder]):
                bad.append(f"{path.relative_to(REPO)} imports {mod}")
    assert not bad, "\n".join(bad)


def test_artifact_and_server_import_without_torch():
    code = ("import sys, irpe.artifact, irpe.artifact.preprocess, irpe.server; "
            "assert 'torch' not in sys.modules, 'torch was imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_cli_models_lists_published_variants_with_params():
    out = subprocess.run([sys.executable, "-m", "irpe", "models"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("deit_tiny_patch16_224_ctx_product_50_shared_k"))
    assert "5.76M" in line and "ctx product" in line
    assert len(out.stdout.splitlines()) >= 1 + 16
