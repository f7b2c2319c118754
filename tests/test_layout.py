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


def _package_dirs() -> dict[str, Path]:
    """``irpe.x`` -> its folder, from pyproject's package-dir."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: REPO / folder for name, folder in config.items()}


def _imported_modules(path: Path, package: str) -> set[str]:
    """What ``path`` imports, with ``from pkg import name`` as ``pkg.name`` (a submodule when it is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def _module_graph() -> dict[str, set[str]]:
    """Every module of the irpe package -> the irpe modules it imports (function-level imports too)."""
    modules: dict[str, Path] = {}
    for package, folder in sorted(_package_dirs().items(), key=lambda kv: -len(kv[0])):
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *rel[:-1])) if rel[-1] == "__init__" else ".".join((package, *rel))
            modules.setdefault(name, path)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for mod in _imported_modules(path, package):
            while mod and mod not in modules:  # "from .x import name": the module x, not the name
                mod = mod.rpartition(".")[0]
            if mod and mod != name and mod != "irpe":
                targets.add(mod)
        graph[name] = targets
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (as a path), or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_import_cycle_anywhere_in_the_package():
    graph = _module_graph()
    assert len(graph) > 100 and "irpe.server.http.app" in graph
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_fastapi_and_starlette_only_in_server_http():
    bad = []
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[0] in (".venv", "tests", "build") or rel.parts[:2] == ("server", "http"):
            continue
        if rel.parts == ("bench", "naive_server.py"):  # the benchmark's plain-FastAPI baseline, not the product
            continue
        for mod in _imports(path, "irpe"):
            if mod.split(".")[0] in ("fastapi", "starlette"):
                bad.append(f"{rel} imports {mod}")
    assert not bad, "\n".join(bad)


_RECORD_MODULES = '''
import atexit, multiprocessing, os, sys
def _record():
    name = multiprocessing.current_process().name
    with open(os.path.join(os.environ["IRPE_TEST_MODULES_DIR"], f"{name}.{os.getpid()}"), "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
atexit.register(_record)
'''


def test_live_engine_process_has_no_fastapi_or_starlette(tmp_path: Path):
    import os
    import signal

    import httpx

    from tests.server.helpers import announced_url, encode, image, make_artifact, wait_ready

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_RECORD_MODULES)
    art = make_artifact(tmp_path / "art")
    env = {**os.environ, "PYTHONPATH": str(hook), "IRPE_TEST_MODULES_DIR": str(hook)}
    proc = subprocess.Popen([sys.executable, "-m", "irpe", "serve", str(art), "--port", "0", "--frontends", "1",
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        url = announced_url(proc)
        wait_ready(url, timeout=90)
        r = httpx.post(url + "/classify", content=encode(image()), headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    engine = [p for p in hook.iterdir() if p.name.startswith("irpe-engine.")]
    assert len(engine) == 1, sorted(p.name for p in hook.iterdir())
    engine_mods = engine[0].read_text().split()
    assert "irpe.server.ipc.engine_server" in engine_mods and "uvicorn" not in engine_mods  # the engine's list
    web = sorted(m for m in engine_mods if m.split(".")[0] in ("fastapi", "starlette"))
    assert not web, f"the engine process imported {web[:5]}"


def test_server_modules_and_functions_stay_small():
    """server/: no module over 400 lines, no function over 40 (docs/architecture.md)."""
    big = []
    for path in sorted((REPO / "server").rglob("*.py")):
        source = path.read_text()
        if len(source.splitlines()) > 400:
            big.append(f"{path.relative_to(REPO)}: {len(source.splitlines())} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 40:
                big.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}")
    assert not big, "\n".join(big)


_VERSION_STATES = {"LOADING", "READY", "UNAVAILABLE", "UNLOADING"}


def _state_literals(tree: ast.AST) -> list[ast.Constant]:
    """String constants naming a version state that are compared, assigned, returned, passed by keyword or
    put in a dict: states are :class:`~irpe.server.hosting.version.VersionState` members, never text (the
    members of an Enum class are where the text is defined)."""
    members = {id(statement) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
               and any(ast.unparse(base).split(".")[-1].endswith("Enum") for base in node.bases)
               for statement in node.body}
    found: dict[int, ast.Constant] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.keyword | ast.Return):
            parts = [] if id(node) in members else [node.value]
        elif isinstance(node, ast.Dict):
            parts = list(node.values)
        else:
            continue
        found.update((id(const), const) for part in parts if part is not None for const in ast.walk(part)
                     if isinstance(const, ast.Constant) and const.value in _VERSION_STATES)
    return sorted(found.values(), key=lambda const: (const.lineno, const.col_offset))


def test_no_version_state_as_a_string_literal_in_server():
    bad = []
    for path in sorted((REPO / "server").rglob("*.py")):
        for const in _state_literals(ast.parse(path.read_text(), filename=str(path))):
            bad.append(f"{path.relative_to(REPO)}:{const.lineno} {const.value!r}: use VersionState.{const.value}")
    assert not bad, "\n".join(bad)


def test_state_literal_finder_finds_them():
    code = 'a = "READY"\nif b.state == "LOADING": pass\nc = {"state": "UNAVAILABLE"}\nf(state="UNLOADING")\n' \
           'x = "READY" in y\nclass VersionState(str, enum.Enum):\n    READY = "READY"\n'
    assert [const.value for const in _state_literals(ast.parse(code))] == [
        "READY", "LOADING", "UNAVAILABLE", "UNLOADING", "READY"]


def test_no_global_statement_in_the_package():
    bad = []
    for folder in sorted(set(_package_dirs().values())):
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            bad += [f"{path.relative_to(REPO)}:{node.lineno} global {', '.join(node.names)}"
                    for node in ast.walk(tree) if isinstance(node, ast.Global)]
    assert not bad, "module state belongs in an object (a class attribute, a cached factory):\n" + "\n".join(bad)


def _mixed_bool_ops(source: str) -> list[int]:
    """Lines where ``and`` and ``or`` meet without parentheses around the inner one."""
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.BoolOp):
            continue
        for inner in node.values:
            if isinstance(inner, ast.BoolOp) and type(inner.op) is not type(node.op):
                start = offsets[inner.lineno - 1] + inner.col_offset
                end = offsets[inner.end_lineno - 1] + inner.end_col_offset
                if not (source[:start].rstrip().endswith("(") and source[end:].lstrip().startswith(")")):
                    found.append(inner.lineno)
    return found


def test_and_or_never_mix_without_parentheses_in_server():
    bad = [f"{path.relative_to(REPO)}:{line}" for path in sorted((REPO / "server").rglob("*.py"))
           for line in _mixed_bool_ops(path.read_text())]
    assert not bad, "put parentheses around the inner and / or:\n" + "\n".join(bad)


def test_mixed_bool_op_finder_finds_them():
    assert _mixed_bool_ops("x = a or b and c\ny = a or (b and c)\nz = (a and b) or c\nw = a and b and c\n") == [1]


def _untested_server_modules(table: str) -> list[str]:
    """server/ modules with neither a test file named after them (tests/server/<layer>/test_<name>.py) nor a
    row `server/...py` in the table of tests/server/README.md."""
    missing = []
    for module in sorted((REPO / "server").rglob("*.py")):
        relative = module.relative_to(REPO / "server")
        if module.name == "__init__.py":
            continue
        test_file = REPO / "tests" / "server" / relative.parent / f"test_{module.stem}.py"
        if not test_file.is_file() and f"| `server/{relative.as_posix()}` |" not in table:
            missing.append(f"server/{relative.as_posix()}")
    return missing


def test_every_server_module_has_its_test_file_or_a_row_saying_where_it_is_tested():
    readme = (REPO / "tests" / "server" / "README.md").read_text()
    assert _untested_server_modules(readme) == [], (
        "add tests/server/<layer>/test_<name>.py, or a row in tests/server/README.md's table naming the tests")


def test_the_test_file_rule_sees_a_module_without_either():
    assert "server/hosting/host.py" in _untested_server_modules("")


def test_tests_of_server_mirror_its_layers():
    """No test module lies flat in tests/server/ unless server/ has a top-level module of that name."""
    top_level = {p.stem for p in (REPO / "server").glob("*.py")}
    flat = [p.name for p in (REPO / "tests" / "server").glob("test_*.py")
            if p.stem.removeprefix("test_") not in top_level | {"cli"}]
    assert flat == [], "move them to the folder of the layer they test (tests/server/README.md)"
