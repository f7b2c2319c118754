"""The client examples of docs/api/http.md, kserve-v2.md and grpc-health.md run as written against a real server.

A fenced ``python`` or ``bash`` block right after a ``<!-- test:client -->`` line is an example. It runs in one
temporary directory per page (so a block may use a file an earlier block of its page wrote) against ``irpe serve
digits`` on free 127.0.0.1 ports: ``127.0.0.1:8000`` in the block becomes the HTTP address and
``127.0.0.1:8001`` the gRPC one. It must exit 0 and print what the ``text`` block after it shows; numbers with
a decimal point may differ in their fourth significant digit (another CPU rounds the last bits differently).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.reliability.procs import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]
PAGES = ("docs/api/http.md", "docs/api/kserve-v2.md", "docs/api/grpc-health.md")
MARKER = "<!-- test:client -->"
_FENCE = re.compile(r"^```(\w*)\s*$")
_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
_GRPC_LINE = re.compile(r"gRPC listening on 127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class Example:
    """One tested block: where it is, its language, its code and the output the page shows."""

    page: str
    line: int
    language: str
    code: str
    expected: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _fenced_blocks(lines: list[str]) -> Iterator[tuple[int, int, str, str]]:
    """(marker-preceded flag as 1/0, opening line number, language, body) of every fenced block."""
    index, marked = 0, 0
    while index < len(lines):
        line = lines[index]
        if line.strip() == MARKER:
            marked = 1
        match = _FENCE.match(line)
        if not match:
            if line.strip() and line.strip() != MARKER:
                marked = 0
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        yield marked, index + 1, match.group(1), "\n".join(lines[index + 1:end])
        marked, index = 0, end + 1


def examples(page: str) -> list[Example]:
    """The tested blocks of ``page``, each with the ``text`` block that follows it.

    Args:
        page: path of the Markdown page, relative to the repository.

    Returns:
        The examples in page order.

    Raises:
        ValueError: a marked block is not python or bash, or no ``text`` block follows it.
    """
    blocks = list(_fenced_blocks((REPO / page).read_text().splitlines()))
    found = []
    for position, (marked, line, language, code) in enumerate(blocks):
        if not marked:
            continue
        if language not in ("python", "bash"):
            raise ValueError(f"{page}:{line}: a {MARKER} block must be python or bash, found {language!r}")
        following = blocks[position + 1] if position + 1 < len(blocks) else None
        if following is None or following[2] != "text":
            raise ValueError(f"{page}:{line}: put the expected output in a ```text block right after the example")
        found.append(Example(page, line, language, code, following[3]))
    return found


def same_output(printed: str, expected: str) -> bool:
    """Whether ``printed`` is ``expected``, floats compared to a relative 1e-3.

    Args:
        printed: what the example printed.
        expected: what the page shows.

    Returns:
        True when the text outside the floats is identical and each float pair is close.
    """
    printed, expected = printed.strip(), expected.strip()
    if _FLOAT.sub("#", printed) != _FLOAT.sub("#", expected):
        return False
    pairs = zip(_FLOAT.findall(printed), _FLOAT.findall(expected), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=1e-3, abs_tol=1e-6) for a, b in pairs)


def test_same_output_compares_text_and_floats() -> None:
    assert same_output("7 0.8985\n", "7 0.8986")
    assert not same_output("7 0.90", "7 0.80")
    assert not same_output("9 0.899", "7 0.899")


def test_every_page_has_examples() -> None:
    for page in PAGES:
        assert examples(page), f"{page} has no {MARKER} block"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[ServerProcess, int]]:
    """``irpe serve digits`` with HTTP and gRPC on free 127.0.0.1 ports."""
    proc = start_server(Path("digits"), "--grpc-port", "0")
    try:
        ports = _GRPC_LINE.findall(proc.output())
        assert ports, f"no gRPC address in the server's output:\n{proc.output()}"
        yield proc, int(ports[0])
    finally:
        proc.stop()
        proc.log.unlink(missing_ok=True)


def _run(example: Example, workdir: Path, http: str, grpc: str) -> subprocess.CompletedProcess[str]:
    code = example.code.replace("127.0.0.1:8000", http).replace("127.0.0.1:8001", grpc)
    command = [sys.executable, "-c", code] if example.language == "python" else ["bash", "-euo", "pipefail", "-c", code]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRPE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("page", PAGES)
def test_client_examples_print_what_the_page_shows(page: str, server: tuple[ServerProcess, int],
                                                   tmp_path: Path) -> None:
    proc, grpc_port = server
    http = proc.url.removeprefix("http://")
    for example in examples(page):
        result = _run(example, tmp_path, http, f"127.0.0.1:{grpc_port}")
        assert result.returncode == 0, f"{example} exited {result.returncode}:\n{result.stdout}{result.stderr}"
        assert same_output(result.stdout, example.expected), (
            f"{example} printed:\n{result.stdout}\nthe page shows:\n{example.expected}")
