"""Schemathesis against the server's own ``/openapi.json`` (bounded, 127.0.0.1 only): no 5xx, 2xx JSON
bodies conform to the declared schema, 4xx answers are declared and their bodies conform to the declared
``ErrorResponse`` (and have the JSON error shape).

The operations are read from the live schema at test time (schemathesis' lazy ``from_fixture`` loader does
not work with this pytest), and each gets ``MAX_EXAMPLES`` Hypothesis examples.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.core.failures import FailureGroup
from schemathesis.openapi.checks import JsonSchemaError
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.reliability.procs import ServerProcess
from tests.reliability.record import RECORDS

MAX_EXAMPLES = 20  # per operation and generation mode (positive, negative)
# Triton's answer to model control without --model-control explicit: 503, documented on the routes
_TRITON_503 = ("/v2/repository/models/{name}/load", "/v2/repository/models/{name}/unload")


def _check(case: schemathesis.Case, server: ServerProcess) -> int:
    response = case.call(base_url=server.url, timeout=30)
    RECORDS.append(("schemathesis", f"{case.method} {case.operation.path}", response.status_code, ""))
    where = f"{case.method} {case.formatted_path} query={case.query}"
    triton_503 = response.status_code == 503 and case.operation.path in _TRITON_503
    assert response.status_code < 500 or triton_503, f"{where}: {response.status_code} {response.text[:300]}"
    ctype = str(response.headers.get("content-type", ""))
    if response.status_code < 300 and "application/json" in ctype:
        case.validate_response(response, checks=[response_schema_conformance])
    elif response.status_code >= 400 and case.operation.path not in ("/readyz", "/healthz", "/v2/health/ready"):
        case.validate_response(response, checks=[status_code_conformance, response_schema_conformance])
        body = response.json()
        if case.operation.path.startswith("/v2"):  # the Open Inference Protocol's {"error": "message"}
            assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], f"{where}: {body}"
        else:
            assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"], f"{where}: {body}"
    return response.status_code


def _fuzz_operation(op: Any, mode: schemathesis.GenerationMode, server: ServerProcess) -> int:
    """Run ``MAX_EXAMPLES`` generated cases of one operation; returns how many were sent."""
    calls = [0]

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        calls[0] += 1
        _check(case, server)

    run()
    return calls[0]


def test_openapi_operations(server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    failures: list[str] = []
    counts: dict[str, int] = {}
    started = time.monotonic()
    for op in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            label = f"{op.label} [{mode.value}]"
            try:
                counts[label] = _fuzz_operation(op, mode, server)
            except Unsatisfiable:  # nothing to negate (no parameters, or unconstrained strings)
                continue
            except Exception as e:  # collect every operation's failure, then fail once with all of them
                failures.append(f"{label}: {str(e)[:600]}")
    print(f"schemathesis: {sum(counts.values())} calls over {len(counts)} operations in "
          f"{time.monotonic() - started:.1f}s: {counts}")
    assert not failures, "\n\n".join(failures)
    log = server.output()
    assert server.proc.poll() is None
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]


ERROR_REF = "#/components/schemas/ErrorResponse"
V2_ERROR_REF = "#/components/schemas/V2ErrorResponse"


def test_error_responses_declare_the_real_error_model(server: ServerProcess) -> None:
    """Every declared 4xx/5xx of the non-health routes is ErrorResponse; FastAPI's default 422 is gone."""
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "HTTPValidationError" not in str(spec) and "ValidationError" not in spec["components"]["schemas"]
    error = spec["components"]["schemas"]["ErrorResponse"]
    assert error["required"] == ["error"] and error.get("additionalProperties") is False
    declared = {}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            for status, resp in op["responses"].items():
                if status >= "400" and path not in ("/healthz", "/readyz") and not path.endswith("ready"):
                    ref = resp["content"]["application/json"]["schema"]["$ref"]
                    want = V2_ERROR_REF if path.startswith("/v2") else ERROR_REF
                    assert ref == want, f"{method} {path} {status}: {ref}"
                    declared.setdefault(f"{method} {path}", set()).add(status)
    assert declared["post /classify"] == {"400", "401", "404", "413", "415", "422", "500", "503", "504"}
    assert {"400", "404", "413"} <= declared["post /v2/models/{name}/infer"]
    assert declared["get /v1/models/{name}"] == {"401", "404", "500"}


ERRORS = [  # (path, method, request kwargs, status)
    ("/classify", "POST", {"params": {"top_k": 0}, "content": b"x", "headers": {"content-type": "image/png"}}, 422),
    ("/classify", "POST", {"content": b"", "headers": {"content-type": "image/png"}}, 400),
    ("/classify", "POST", {"content": b"plain", "headers": {"content-type": "text/plain"}}, 415),
    ("/classify", "POST", {"content": b"not an image", "headers": {"content-type": "image/png"}}, 415),
    ("/v1/models/{name}", "GET", {}, 404),
    ("/classify", "POST", {"params": {"model": "nope"}, "content": b"x",
                           "headers": {"content-type": "image/png"}}, 404),
    ("/v2/models/{name}/infer", "POST", {"content": b'{"inputs": []}'}, 400),
    ("/v2/models/{name}/infer", "POST", {"content": b"{nope"}, 400),
]


@pytest.mark.parametrize(("path", "method", "kwargs", "status"), ERRORS)
def test_error_answers_conform_to_the_declared_schema(server: ServerProcess, path: str, method: str,
                                                      kwargs: dict[str, Any], status: int) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    url = server.url + path.replace("{name}", "nope" if status == 404 else "tiny-mean")
    response = httpx.request(method, url, timeout=30, **kwargs)
    assert response.status_code == status, response.text
    assert schema[path][method].validate_response(response) is not False
    fake = httpx.Response(status, json={"detail": [{"loc": ["query"], "msg": "x", "type": "y"}]},
                          request=response.request)
    fake.elapsed = response.elapsed
    with pytest.raises(FailureGroup) as failed:  # FastAPI's default shape would not conform
        schema[path][method].validate_response(fake)
    assert any(isinstance(f, JsonSchemaError) for f in failed.value.exceptions), failed.value.exceptions
