#!/usr/bin/env python3
"""A small mutation check: does the test suite notice when the code under test changes?

For each target module, every mutation point (comparison, arithmetic and boolean operators, ``not``,
integer and boolean constants, augmented assignments) gives one mutant: the module is rewritten with that
single change, the module's tests run (``-x``, time-limited), and the mutant counts as killed when they fail.
The original file is restored after every mutant (and on Ctrl-C). Run from the repository root:

    .venv/bin/python scripts/mutate.py                      # every target, every mutant
    .venv/bin/python scripts/mutate.py --every 3 --json out.json   # every third mutant of each target
    .venv/bin/python scripts/mutate.py --target server/batching.py

Survivors are listed with their line; some are equivalent mutants (no behaviour change), the rest are
missing tests. Modifies files in place while it runs: do not run it beside other work in the same checkout.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS: dict[str, list[str]] = {
    "models/buckets.py": ["tests/models/test_buckets.py", "tests/models/test_rpe.py"],
    "export/rpe_graph.py": ["tests/export/test_onnx.py", "-k",
                            "rpe_configurations or bias_mode or contextual_graph or distilled or tables_reach"],
    "server/batching.py": ["tests/server/test_batching.py", "tests/server/end_to_end/test_server_states.py", "-k",
                           "not workers and not invalid"],
    "artifact/preprocess.py": ["tests/server/pipeline/test_preprocess.py", "tests/artifact/test_resample.py",
                               "tests/server/pipeline/test_decode.py"],
}
SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.Add: ast.Sub,
        ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv,
        ast.And: ast.Or, ast.Or: ast.And, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}


@dataclass
class Mutant:
    target: str
    index: int
    line: int
    what: str
    killed: bool | None = None
    seconds: float = 0.0


def _annotation_ids(tree: ast.AST) -> set[int]:
    """ids of every node inside a type annotation (never mutated)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        annotations = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            annotations.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            annotations.append(node.returns)
        for a in annotations:
            skip.update(id(n) for n in ast.walk(a))
    return skip


def points(tree: ast.AST) -> list[tuple[ast.AST, int, str]]:
    """(node, slot, description) for every mutation point, in a stable order."""
    skip = _annotation_ids(tree)
    out: list[tuple[ast.AST, int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            out += [(node, i, f"{type(op).__name__} -> {SWAP[type(op)].__name__}")
                    for i, op in enumerate(node.ops) if type(op) in SWAP]
        elif isinstance(node, ast.BinOp | ast.BoolOp | ast.AugAssign) and type(node.op) in SWAP:
            out.append((node, 0, f"{type(node.op).__name__} -> {SWAP[type(node.op)].__name__}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, 0, "drop not"))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, bool):
            new = (not node.value) if isinstance(node.value, bool) else node.value + 1
            out.append((node, 0, f"{node.value!r} -> {new!r}"))
    return out


class _DropNot(ast.NodeTransformer):
    def __init__(self, target: ast.UnaryOp):
        self.target = target

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:  # noqa: N802 (ast visitor name)
        return node.operand if node is self.target else self.generic_visit(node)


def mutated_source(source: str, index: int) -> tuple[str, int, str]:
    """The module with mutation ``index`` applied: (source, line, description)."""
    tree = ast.parse(source)
    tree = copy.deepcopy(tree)
    node, slot, what = points(tree)[index]
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Compare):
        node.ops[slot] = SWAP[type(node.ops[slot])]()
    elif isinstance(node, ast.BinOp | ast.BoolOp | ast.AugAssign):
        node.op = SWAP[type(node.op)]()
    elif isinstance(node, ast.UnaryOp):
        tree = _DropNot(node).visit(tree)
    elif isinstance(node, ast.Constant):
        node.value = (not node.value) if isinstance(node.value, bool) else node.value + 1
    return ast.unparse(ast.fix_missing_locations(tree)), line, what


def run_tests(tests: list[str], timeout: float) -> bool:
    """True when the tests fail (or time out): the mutant is killed."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True
    return out.returncode != 0


def check_target(target: str, every: int, timeout: float) -> list[Mutant]:
    path = REPO / target
    original = path.read_text()
    tests = TARGETS[target]
    if run_tests(tests, timeout * 4):
        raise SystemExit(f"{target}: its tests fail without any mutation; fix them first")
    results = []
    try:
        for index in range(0, len(points(ast.parse(original))), every):
            source, line, what = mutated_source(original, index)
            path.write_text(source)
            start = time.monotonic()
            killed = run_tests(tests, timeout)
            m = Mutant(target, index, line, what, killed, round(time.monotonic() - start, 1))
            results.append(m)
            print(f"{target}:{line} {what}: {'killed' if killed else 'SURVIVED'} ({m.seconds}s)", flush=True)
    finally:
        path.write_text(original)
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", action="append", choices=sorted(TARGETS), help="default: all")
    p.add_argument("--every", type=int, default=1, help="check every n-th mutant (a deterministic sample)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per test run (a hang counts as killed)")
    p.add_argument("--json", help="write every mutant's result here")
    args = p.parse_args()
    results: list[Mutant] = []
    for target in args.target or list(TARGETS):
        total = len(points(ast.parse((REPO / target).read_text())))
        print(f"== {target}: {total} mutation points, checking every {args.every}", flush=True)
        results += check_target(target, args.every, args.timeout)
    print("\nkill rate by module:")
    for target in dict.fromkeys(m.target for m in results):
        ms = [m for m in results if m.target == target]
        killed = sum(bool(m.killed) for m in ms)
        print(f"  {target}: {killed}/{len(ms)} killed ({100 * killed / max(len(ms), 1):.0f}%)")
    killed = sum(bool(m.killed) for m in results)
    print(f"  total: {killed}/{len(results)} ({100 * killed / max(len(results), 1):.0f}%)")
    survivors = [m for m in results if not m.killed]
    if survivors:
        print("survivors:")
        for m in survivors:
            line = (REPO / m.target).read_text().splitlines()[m.line - 1].strip() if m.line else ""
            print(f"  {m.target}:{m.line} {m.what}   | {line}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(m) for m in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
