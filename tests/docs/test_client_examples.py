"""The examples of the docs/api pages run as written against the server the page names.

A page says which server its examples ran against with a ``<!-- test:serve [VAR=VALUE ...] irpe serve digits
[FLAGS] -->`` line (its prose names the same command); it holds for the blocks after it, up to the next such
line. A fenced block right after ``<!-- test:client -->`` is an example:

* ``python`` and ``bash`` blocks run whole (python, bash with ``-euo pipefail``) and must print what the
  ``text`` block right after them shows;
* ``console`` blocks are transcripts: each ``$ `` line (with its ``\\`` continuation lines) runs in bash on its
  own, and the outputs, one after the other, must be the transcript's other lines.

The examples of one page run in one temporary directory (so a block may use a file an earlier block wrote),
against that server on free 127.0.0.1 ports: ``127.0.0.1:8000`` in a block becomes its HTTP address and
``127.0.0.1:8001`` its gRPC one (``--grpc-port 8001`` starts it on a free port). Numbers with a decimal point
may differ in their fourth significant digit (another CPU rounds the last bits differently), and a ``timing_ms``
object may hold any timings.

A bash block after ``<!-- test:perf_analyzer -->`` runs from the repository root (it calls
``scripts/perf-analyzer.sh``) and must exit 0; its ``text`` block is perf_analyzer's report trimmed: a ``...``
line stands for any lines, and any number matches any number.

Servers and examples run from the non-editable install of tests/docs/install.py: ``python`` and ``irpe`` are
that venv's, and the repository root comes first on ``sys.path``, as for a reader who runs them from the root
(where a folder named ``irpe`` would shadow the install).
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.benchmarks.test_triton_bench import _perf_analyzer_runs
from tests.docs.install import Installed
from tests.reliability.procs import ServerProcess, start_server

REPO = Path(__file__).resolve().parents[2]
PAGES = ("docs/api/http.md", "docs/api/kserve-v2.md", "docs/api/grpc-health.md", "docs/api/shared-memory.md")
CLIENT, PERF = "<!-- test:client -->", "<!-- test:perf_analyzer -->"
PAGE_HTTP, PAGE_GRPC = "127.0.0.1:8000", "127.0.0.1:8001"
_SERVE = re.compile(r"<!-- test:serve ((?:[A-Z_]+=\S+ )*)irpe serve (digits(?: [^>]*?)?) -->")
_FENCE = re.compile(r"^```(\w*)\s*$")
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_FLOAT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
_TIMINGS = re.compile(r'("timing_ms":\s*)\{[^}]*\}')
_GRPC_LINE = re.compile(r"gRPC listening on 127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class Serve:
    """The server a page's examples ran against: ``irpe serve`` arguments and environment, as the page writes
    them."""

    env: tuple[tuple[str, str], ...]
    args: tuple[str, ...]

    def flags(self) -> list[str]:
        """The flags after the model, with the page's gRPC port replaced by a free one."""
        flags = list(self.args[1:])
        if "--grpc-port" in flags:
            flags[flags.index("--grpc-port") + 1] = "0"
        return flags

    def __str__(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env), "irpe serve", *self.args])


@dataclass(frozen=True)
class Example:
    """One tested block: where it is, its kind and language, its code, the output the page shows and the
    server it ran against."""

    page: str
    line: int
    kind: str
    language: str
    code: str
    expected: str
    serve: Serve

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _parse_serve(line: str) -> Serve | None:
    match = _SERVE.fullmatch(line.strip())
    if not match:
        return None
    env = tuple(tuple(pair.split("=", 1)) for pair in match.group(1).split())
    return Serve(env=env, args=tuple(shlex.split(match.group(2))))  # type: ignore[arg-type]


def _fenced_blocks(lines: list[str]) -> Iterator[tuple[str, int, str, str, Serve | None]]:
    """(marker kind or "", opening line number, language, body, the server in force) of every fenced block."""
    index, marked, serve = 0, "", None
    while index < len(lines):
        line = lines[index].strip()
        serve = _parse_serve(line) or serve
        match = _FENCE.match(lines[index])
        if not match:
            if line in (CLIENT, PERF):
                marked = "client" if line == CLIENT else "perf_analyzer"
            elif line and not line.startswith("<!-- test:"):
                marked = ""
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        yield marked, index + 1, match.group(1), "\n".join(lines[index + 1:end]), serve
        marked, index = "", end + 1


def examples(page: str, text: str | None = None) -> list[Example]:
    """The tested blocks of ``page``, each with the ``text`` block that follows it.

    Args:
        page: path of the Markdown page, relative to the repository.
        text: the page's Markdown (default: read from the file).

    Returns:
        The examples in page order.

    Raises:
        ValueError: a marked block has a language its marker does not take, no ``text`` block follows it, or
            no ``<!-- test:serve ... -->`` line comes before it.
    """
    text = (REPO / page).read_text() if text is None else text
    blocks = list(_fenced_blocks(text.splitlines()))
    found = []
    for position, (kind, line, language, code, serve) in enumerate(blocks):
        if not kind:
            continue
        allowed = ("python", "bash", "console") if kind == "client" else ("bash",)
        if language not in allowed:
            raise ValueError(f"{page}:{line}: a test:{kind} block must be {' or '.join(allowed)}, found {language!r}")
        following = blocks[position + 1] if position + 1 < len(blocks) else None
        if language != "console" and (following is None or following[2] != "text"):
            raise ValueError(f"{page}:{line}: put the expected output in a ```text block right after the example")
        if serve is None:
            raise ValueError(f"{page}:{line}: no <!-- test:serve irpe serve digits ... --> line before the example")
        expected = following[3] if language != "console" else ""  # type: ignore[index]
        found.append(Example(page, line, kind, language, code, expected, serve))
    return found


def console_steps(transcript: str) -> tuple[list[str], str]:
    """Split a ``console`` transcript into its commands and the output it shows.

    Args:
        transcript: the block's lines: ``$ command`` (continued by lines after a trailing backslash) and output.

    Returns:
        The commands, and the output lines joined.
    """
    commands, output, continued = [], [], False
    for line in transcript.splitlines():
        if continued:
            commands[-1] += "\n" + line
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            output.append(line)
        continued = (continued or line.startswith("$ ")) and line.rstrip().endswith("\\")
    return commands, "\n".join(output)


def same_output(printed: str, expected: str) -> bool:
    """Whether ``printed`` is ``expected``, floats compared to a relative 1e-3 and timings left out.

    Args:
        printed: what the example printed.
        expected: what the page shows.

    Returns:
        True when the text outside the floats is identical and each float pair is close.
    """
    printed, expected = (_TIMINGS.sub(r"\1{}", s.strip()) for s in (printed, expected))
    if _FLOAT.sub("#", printed) != _FLOAT.sub("#", expected):
        return False
    pairs = zip(_FLOAT.findall(printed), _FLOAT.findall(expected), strict=True)
    return all(math.isclose(float(a), float(b), rel_tol=1e-3, abs_tol=1e-6) for a, b in pairs)


def same_report(printed: str, expected: str) -> bool:
    """Whether ``printed`` has the lines of a trimmed report: ``...`` stands for any lines, a number for any
    number; leading and trailing spaces do not count.

    Args:
        printed: what the command printed.
        expected: the trimmed report the page shows.

    Returns:
        True when ``printed`` matches.
    """
    pattern = []
    for line in expected.strip().splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
            continue
        parts = re.split(_NUMBER, line.strip())
        pattern.append(_NUMBER.join(re.escape(part) for part in parts) + r"\n")
    lines = "".join(f"{line.strip()}\n" for line in printed.strip().splitlines())
    return re.fullmatch("".join(pattern), lines) is not None


def test_output_comparisons_take_what_differs_between_runs_and_no_more() -> None:
    assert same_output("7 0.8985\n", "7 0.8986")
    assert not same_output("7 0.90", "7 0.80")
    assert not same_output("9 0.899", "7 0.899")
    assert same_output('{"a":1,"timing_ms":{"total":3.5},"b":2}', '{"a":1,"timing_ms":{"total":12.1},"b":2}')
    assert not same_output('{"a":1,"timing_ms":{"total":3.5}}', '{"a":2,"timing_ms":{"total":3.5}}')
    one, eight = "Concurrency: 1, throughput: 82.5 infer/sec", "Concurrency: 8, throughput: 91 infer/sec"
    report = f"head\n{one}\nmiddle\n  {eight}\n"
    assert same_report(report, f"...\n{one.replace('82.5', '1.0')}\n...\n{eight.replace('91', '2')}")
    assert not same_report(report, f"...\n{eight}\n{one}")
    assert not same_report(report, "head\nConcurrency: 1, throughput: 82.5 infer/s")


def test_pages_are_parsed_as_written() -> None:
    page = ("<!-- test:serve IRPE_API_KEY=k irpe serve digits --grpc-port 8001 -->\n<!-- test:client -->\n"
            "```console\n$ curl -s a \\\n    b\nout 1\n$ echo\n```\n\n<!-- test:perf_analyzer -->\n```bash\npa\n```\n"
            "\n```text\n...\n```\n")
    console, perf = examples("page.md", page)
    assert console.serve.flags() == ["--grpc-port", "0"] and dict(console.serve.env) == {"IRPE_API_KEY": "k"}
    assert console_steps(console.code) == (["curl -s a \\\n    b", "echo"], "out 1")
    assert (perf.kind, perf.code, perf.expected) == ("perf_analyzer", "pa", "...")
    with pytest.raises(ValueError, match="no <!-- test:serve"):
        examples("page.md", "<!-- test:client -->\n```bash\nx\n```\n```text\n```\n")


def test_every_page_has_examples_against_the_server_its_prose_names() -> None:
    for page in PAGES:
        found = examples(page)
        assert any(e.kind == "client" for e in found), f"{page} has no {CLIENT} block"
        text = (REPO / page).read_text()
        for serve in {e.serve for e in found}:
            assert f"`{serve}`" in text, f"{page}: its prose does not name `{serve}`, which its examples run against"


@pytest.fixture(scope="module")
def servers(installed: Installed) -> Iterator[Callable[[Serve], tuple[str, str]]]:
    """Start (once each, from the non-editable install) the servers the pages name; yields a function from a
    page's server to its HTTP and gRPC addresses."""
    running: dict[Serve, tuple[ServerProcess, str, str]] = {}

    def address(serve: Serve) -> tuple[str, str]:
        if serve not in running:
            proc = start_server(Path(serve.args[0]), *serve.flags(), env=installed.env(**dict(serve.env)),
                                python=installed.python)
            ports = _GRPC_LINE.findall(proc.output())
            assert ports or "--grpc-port" not in serve.args, f"no gRPC address in:\n{proc.output()}"
            running[serve] = (proc, proc.url.removeprefix("http://"), f"127.0.0.1:{ports[0] if ports else 1}")
        return running[serve][1:]

    try:
        yield address
    finally:
        for proc, _, _ in running.values():
            proc.stop()
            proc.log.unlink(missing_ok=True)


def _run(command: list[str], code: str, cwd: Path, addresses: tuple[str, str], installed: Installed,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``command code`` with the install's python and irpe first on PATH and the repository root first on
    sys.path (as for a reader who runs it from the root), the page's addresses replaced by the servers'."""
    code = code.replace(PAGE_HTTP, addresses[0]).replace(PAGE_GRPC, addresses[1])
    env = installed.env(PYTHONPATH=str(REPO))
    return subprocess.run([*command, code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _printed(example: Example, workdir: Path, addresses: tuple[str, str], installed: Installed) -> tuple[str, str]:
    """Run one client example; returns (what it printed, what the page shows)."""
    if example.language == "console":
        commands, expected = console_steps(example.code)
        printed = []
        for command in commands:
            result = _run(["bash", "-euo", "pipefail", "-c"], command, workdir, addresses, installed)
            assert result.returncode == 0, f"{example}: {command!r} exited {result.returncode}:\n{result.stderr}"
            printed.append(result.stdout.strip())
        return "\n".join(p for p in printed if p), expected
    shell = [str(installed.python), "-c"] if example.language == "python" else ["bash", "-euo", "pipefail", "-c"]
    result = _run(shell, example.code, workdir, addresses, installed)
    assert result.returncode == 0, f"{example} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return result.stdout, example.expected


@pytest.mark.parametrize("page", PAGES)
def test_client_examples_print_what_the_page_shows(page: str, servers: Callable[[Serve], tuple[str, str]],
                                                   installed: Installed, tmp_path: Path) -> None:
    for example in examples(page):
        if example.kind == "client":
            printed, expected = _printed(example, tmp_path, servers(example.serve), installed)
            assert same_output(printed, expected), f"{example} printed:\n{printed}\nthe page shows:\n{expected}"


@pytest.mark.perf_analyzer  # IRPE_TEST_WITHOUT=perf_analyzer opts out (tests/conftest.py)
@pytest.mark.skipif(not _perf_analyzer_runs(), reason="perf_analyzer (or its podman image) is not here")
def test_perf_analyzer_examples_report_what_the_pages_show(servers: Callable[[Serve], tuple[str, str]],
                                                           installed: Installed) -> None:
    found = [e for page in PAGES for e in examples(page) if e.kind == "perf_analyzer"]
    assert found, f"no {PERF} block in {', '.join(PAGES)}"
    for example in found:
        result = _run(["bash", "-euo", "pipefail", "-c"], example.code, REPO, servers(example.serve), installed,
                      timeout=300)
        assert result.returncode == 0, f"{example} exited {result.returncode}:\n{result.stdout}{result.stderr}"
        assert same_report(result.stdout, example.expected), (
            f"{example} printed:\n{result.stdout}\nthe page shows (trimmed):\n{example.expected}")
