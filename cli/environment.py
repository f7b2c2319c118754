"""The environment variables irpe reads besides ``irpe serve``'s settings (those are ``Settings`` fields).

This table is what docs/configuration.md lists (``python -m irpe.docs_reference`` writes it), and
tests/docs/test_reference.py fails when the package reads an ``IRPE_*`` variable that is neither a
``Settings`` field nor a row here. A new variable gets a row here, then the generator is run again.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvironmentVariable:
    """One variable: its name, the value used when it is unset, what it does, and what reads it."""

    name: str
    default: str
    meaning: str
    read_by: str
    flag: str = ""  # the flag that wins over the variable, if any


VARIABLES: tuple[EnvironmentVariable, ...] = (
    EnvironmentVariable(
        "IRPE_DEBUG", "unset", "any non-empty value: a user error or a missing optional package ends with the "
        "full Python traceback instead of one line", "every irpe command"),
    EnvironmentVariable(
        "IRPE_CACHE", "~/.cache/irpe/checkpoints", "where the released weights of published variants are "
        "downloaded to and looked up", "irpe export --pretrained, irpe classify --pretrained"),
    EnvironmentVariable(
        "IRPE_MODEL_MIRROR", "the authors' GitHub release", "base URL to fetch released weights from instead "
        "(a mirror holding the same file names); each file is checked against its pinned or first-recorded "
        "SHA-256",
        "irpe export --pretrained, irpe classify --pretrained"),
    EnvironmentVariable(
        "IRPE_OFFLINE", "unset", "1, true, yes or on: never download; a published variant must already be in "
        "IRPE_CACHE", "irpe export --pretrained, irpe classify --pretrained"),
    EnvironmentVariable(
        "IRPE_DATA_DIR", "~/.cache/irpe", "cache directory for the digits data, the retrained checkpoint and "
        "its artifact", "irpe quickstart", flag="irpe quickstart --data-dir"),
    EnvironmentVariable(
        "IRPE_CUDA_DEVICE", "0", "index of the GPU that ONNX Runtime's CUDA provider runs on with --device cuda",
        "irpe serve, irpe classify"),
    EnvironmentVariable(
        "IRPE_ORT_OPS", "1", "0: ONNX Runtime runs model.onnx as exported, without rewriting the iRPE lookups "
        "into irpe's compiled custom ops", "irpe serve, irpe classify, irpe export (parity check), irpe bench"),
    EnvironmentVariable(
        "IRPE_OV_CACHE_DIR", "unset (no cache)", "directory where OpenVINO caches compiled models, so a restart "
        "skips compilation", "irpe serve --backend openvino, irpe classify --backend openvino"),
    EnvironmentVariable(
        "IRPE_WORKER_STATS_DIR", "set by irpe serve --workers N for its workers", "the directory (mode 0700) "
        "where the workers add up their /v2 statistics; made and removed by the launcher, not set by hand",
        "irpe serve --workers N"),
    EnvironmentVariable(
        "IRPE_PERF_ANALYZER", "perf_analyzer on PATH, else scripts/perf-analyzer.sh", "the perf_analyzer command "
        "line", "irpe bench triton", flag="irpe bench triton --perf-analyzer"),
    EnvironmentVariable(
        "IRPE_TRITON_ENV", "~/.cache/irpe/tritonserver-<versions>", "virtual environment holding the real "
        "tritonserver (created there on first use)", "irpe bench triton"),
    EnvironmentVariable(
        "IRPE_TRITON_PYTHON", "/usr/bin/python3", "the Python that creates IRPE_TRITON_ENV", "irpe bench triton"),
    EnvironmentVariable(
        "OTEL_EXPORTER_OTLP_ENDPOINT", "unset (no spans exported)", "OTLP/HTTP collector that request spans are "
        "exported to (needs the [otel] extra); OTEL_EXPORTER_OTLP_TRACES_ENDPOINT works too",
        "irpe serve"),
    EnvironmentVariable(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "unset", "as OTEL_EXPORTER_OTLP_ENDPOINT, for traces only",
        "irpe serve"),
    EnvironmentVariable(
        "OTEL_SERVICE_NAME", "irpe-deploy", "service.name of the exported spans", "irpe serve"),
)
