"""README.md's quickstart runs as written: its commands against a real ``irpe serve digits``.

The quickstart's blocks are marked in README.md with HTML comments: ``<!-- test:quickstart -->`` before the bash
block (``irpe serve ...``, a ``# wait for:`` line, ``curl ...``) and ``<!-- test:quickstart-output -->`` before
the JSON it shows. The server (the ``irpe`` command of the non-editable install in ``tests/docs/conftest.py``)
binds a free port on 127.0.0.1; it and the curl run from the repository root (where the sample image's path is
relative to), the curl with that port substituted.
"""

from __future__ import annotations

import json
import queue
import re
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docs.install import Installed

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_PORT = "8000"
LISTENING = re.compile(r"irpe serve: listening on http://127\.0\.0\.1:(\d+)")
READY = re.compile(r"irpe\.server: ready: ")
START_TIMEOUT_S = 60.0  # the ready line comes within seconds; the margin is for a machine busy with other work
PROBABILITY_TOLERANCE = 1e-4  # another CPU's ONNX Runtime kernels may round the last digits differently


@dataclass(frozen=True)
class Quickstart:
    """The quickstart as README shows it."""

    serve: list[str]
    wait_for: str
    curl: list[str]
    answer: dict[str, Any]


def marked_block(text: str, marker: str) -> str:
    """The fenced code block that follows ``<!-- test:MARKER -->``.

    Args:
        text: README's Markdown.
        marker: the name after ``test:``.

    Returns:
        The block's content, without the fences.

    Raises:
        AssertionError: no such marker, or no code block right after it.
    """
    match = re.search(rf"<!-- test:{re.escape(marker)} -->\s*```[a-z]*\n(.*?)\n```", text, re.DOTALL)
    assert match, f"README.md has no fenced block after <!-- test:{marker} -->"
    return match.group(1)


def read_quickstart(text: str) -> Quickstart:
    """Parse the quickstart's commands and answer out of README's Markdown.

    Args:
        text: README's Markdown.

    Returns:
        The serve command, the log line to wait for, the curl command and the JSON answer.
    """
    lines = [line.strip() for line in marked_block(text, "quickstart").splitlines() if line.strip()]
    serve = [line for line in lines if line.startswith("irpe serve")]
    curl = [line for line in lines if line.startswith("curl ")]
    wait = [line.split("wait for:", 1)[1].strip() for line in lines if "wait for:" in line]
    assert len(serve) == 1 and len(curl) == 1 and len(wait) == 1, f"quickstart block: {lines}"
    answer = json.loads(marked_block(text, "quickstart-output"))
    return Quickstart(serve=shlex.split(serve[0]), wait_for=wait[0], curl=shlex.split(curl[0]), answer=answer)


def same_shape(shown: Any, got: Any, where: str = "answer") -> list[str]:
    """Where ``got`` differs from README's ``shown`` in keys, list lengths or value types.

    Args:
        shown: the JSON value README shows.
        got: the JSON value the server answered.
        where: the path of these values, for the messages.

    Returns:
        One line per difference (empty when the shapes match).
    """
    if isinstance(shown, dict):
        if not isinstance(got, dict) or set(got) != set(shown):
            return [f"{where}: keys {sorted(got) if isinstance(got, dict) else type(got).__name__}, "
                    f"README shows {sorted(shown)}"]
        return [d for key in shown for d in same_shape(shown[key], got[key], f"{where}.{key}")]
    if isinstance(shown, list):
        if not isinstance(got, list) or len(got) != len(shown):
            return [f"{where}: {got!r:.80}, README shows a list of {len(shown)}"]
        return [d for i, (s, g) in enumerate(zip(shown, got, strict=True)) for d in same_shape(s, g, f"{where}[{i}]")]
    numeric = (int, float)
    if isinstance(shown, numeric) and isinstance(got, numeric) and not isinstance(got, bool):
        return []
    return [] if type(shown) is type(got) else [f"{where}: {type(got).__name__}, README shows {type(shown).__name__}"]


@pytest.fixture(scope="module")
def quickstart() -> Quickstart:
    return read_quickstart(README.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def server(quickstart: Quickstart, installed: Installed):
    """README's ``irpe serve`` (installed) on a free 127.0.0.1 port; yields (port, the listening line)."""
    assert quickstart.serve[:2] == ["irpe", "serve"]
    cmd = [str(installed.venv / "bin" / "irpe"), *quickstart.serve[1:], "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=installed.env())
    try:
        listening, seen = None, []
        deadline = time.monotonic() + START_TIMEOUT_S
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if proc.poll() is not None:
                    break  # exited without the lines
                continue
            seen.append(line)
            listening = listening or LISTENING.search(line)
            if listening and READY.search(line):  # the model is warm: a curl now gets its answer, not a 503
                yield int(listening.group(1)), listening.group(0)
                return
        pytest.fail(f"irpe serve (exit {proc.poll()}) printed no 'listening on' and 'ready' lines within "
                    f"{START_TIMEOUT_S:g} s: {''.join(seen[-5:])}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_first_two_commands_are_serve_and_test():
    first = re.search(r"```bash\n(.*?)\n```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert first, "README.md has no bash block"
    commands = [line.strip() for line in first.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert commands[:2] == ["./scripts/serve.sh", "./scripts/test.sh"]


def test_quickstart_is_parsed_as_written():
    text = ("<!-- test:quickstart -->\n```bash\nirpe serve digits\n# wait for:  X\ncurl -F file=@a.png "
            "'http://127.0.0.1:8000/classify'\n```\n<!-- test:quickstart-output -->\n```json\n{\"a\": [1]}\n```\n")
    parsed = read_quickstart(text)
    assert parsed.serve == ["irpe", "serve", "digits"] and parsed.wait_for == "X"
    assert parsed.curl[-1] == "http://127.0.0.1:8000/classify" and parsed.answer == {"a": [1]}
    assert same_shape({"a": [1.5], "b": "x"}, {"a": [2], "b": "y"}) == []
    assert same_shape({"a": [1.5]}, {"a": [1, 2]}) and same_shape({"a": 1}, {"b": 1})
    assert same_shape({"a": "x"}, {"a": 1})


def test_quickstart_log_line_is_what_the_server_prints(quickstart, server):
    port, line = server
    assert line == quickstart.wait_for.replace(f":{README_PORT}", f":{port}")


def test_quickstart_curl_returns_the_json_readme_shows(quickstart, server):
    port, _ = server
    curl = shutil.which("curl")
    assert curl, "the quickstart runs curl: install it (apt-get install curl)"
    args = [arg.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}") for arg in quickstart.curl[1:]]
    done = subprocess.run([curl, "--silent", "--show-error", "--max-time", "20", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"curl {shlex.join(args)}: {done.stderr}"
    answer = json.loads(done.stdout)
    assert same_shape(quickstart.answer, answer) == []
    assert (answer["model"], answer["version"]) == (quickstart.answer["model"], quickstart.answer["version"])
    for shown, got in zip(quickstart.answer["predictions"][0], answer["predictions"][0], strict=True):
        assert (got["index"], got["label"]) == (shown["index"], shown["label"])
        assert got["probability"] == pytest.approx(shown["probability"], abs=PROBABILITY_TOLERANCE)
