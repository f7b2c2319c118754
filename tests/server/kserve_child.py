"""Run a function that uses the kserve SDK in a child interpreter and return what it returns (JSON).

``import kserve`` registers KServe's v2 gRPC messages (package ``inference``) in protobuf's default pool, and
tritonclient's ``service_pb2`` registers Triton's under the same names, so one process cannot import both
(``duplicate symbol 'inference.ServerLiveRequest'``). The suite imports tritonclient.grpc in its own process
(the Ray Serve tests build the application there), so the kserve SDK's clients run in a process of their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_in_child(function: str, *args: Any, timeout: float = 120.0) -> Any:
    """Call ``function`` ("package.module:name") with JSON-able ``args`` in a fresh Python.

    Args:
        function: where the function lives, importable from the repository root.
        args: its positional arguments.
        timeout: seconds the child may take.

    Returns:
        The function's return value, passed back as JSON.

    Raises:
        AssertionError: the child failed; its stderr is the message.
    """
    module, name = function.split(":")
    code = (f"import json, sys; from {module} import {name}; "
            f"print('RESULT ' + json.dumps({name}(*json.loads(sys.argv[1]))))")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert out.returncode == 0 and line, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return json.loads(line[len("RESULT "):])
