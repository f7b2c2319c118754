"""The Open Inference Protocol (KServe v2 / Triton) without its wire: what every front end answers.

The HTTP routes (:mod:`..http.kserve`) and the gRPC service (:mod:`..grpc`) both build their answers here:
server and model metadata, the model configuration (Triton's JSON form of config.pbtxt), statistics, model
readiness, the checks of an inference input and of the requested outputs, the inference itself under the
deadline, and the classification extension's strings. Each front end only translates to and from its wire.
Any refusal is a :class:`ProtocolError` (an :class:`~..errors.APIError`: 400, 413 or 415).
"""

from __future__ import annotations

import math
import random
from typing import Any, NamedTuple

import numpy as np

import irpe
from irpe.artifact import ModelArtifact

from ..errors import APIError
from ..hosting.version import ModelVersion, VersionState
from ..tensors import all_finite
from .service import Service
from .sysshm import OwnedRegions

DATATYPE = "FP32"
SERVER_NAME = "irpe-deploy"
EXTENSIONS = ["classification", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
              "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
              "statistics", "trace", "logging"]  # Triton's, in its order, less "sequence" (no sequence batching)
INLINE_BYTES = 2 << 20  # tensor bytes up to this size are checked on the event loop (cheaper than a pool hop)
LABELS_FILE = "labels.txt"  # what irpe export --format triton writes beside config.pbtxt
OPTIMIZATION = {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True},
                "output_pinned_memory": {"enable": True}, "gather_kernel_buffer_threshold": 0,
                "eager_batching": False}
_CODES = {400: "invalid_input", 413: "payload_too_large", 415: "unsupported_media_type"}


class ProtocolError(APIError):
    """A request the protocol refuses: HTTP ``status`` (400, 413 or 415) and a message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(status, _CODES[status], message)


def server_metadata() -> dict[str, Any]:
    """Server name, version and protocol extensions."""
    return {"name": SERVER_NAME, "version": irpe.__version__, "extensions": list(EXTENSIONS)}


def platform(model_version: ModelVersion) -> tuple[str, str]:
    """Triton's names for what runs a model version.

    Args:
        model_version: the version.

    Returns:
        The (platform, backend) pair.
    """
    if model_version.info and model_version.info.backend == "tensorrt":
        return "tensorrt_plan", "tensorrt"
    if model_version.info and model_version.info.backend == "openvino":
        return "openvino", "openvino"
    return "onnxruntime_onnx", "onnxruntime"


def model_metadata(service: Service, model_version: ModelVersion) -> dict[str, Any]:
    """Triton's model metadata.

    Args:
        service: the process's service (its host lists the model's versions).
        model_version: the version asked about.

    Returns:
        Inputs, outputs, versions and platform of the version (with its backend and precision).
    """
    artifact = model_version.artifact
    assert artifact is not None
    crop = artifact.preprocess.crop
    info = model_version.info
    backend, precision = (info.backend, info.precision) if info else ("", None)
    served = [m.version for m in service.host.versions() if m.name == model_version.name]
    versions = sorted(served) or [model_version.version]
    return {"name": model_version.name, "versions": [str(v) for v in versions], "platform": platform(model_version)[0],
            "parameters": {"backend": backend or None, "precision": precision},
            "inputs": [{"name": artifact.input_name, "datatype": DATATYPE, "shape": [-1, 3, crop, crop]}],
            "outputs": [{"name": artifact.output_name, "datatype": DATATYPE, "shape": [-1, artifact.num_classes]}]}


def _io(model_version: ModelVersion) -> dict[str, Any]:
    artifact = model_version.artifact
    assert artifact is not None
    crop = artifact.preprocess.crop
    return {"input": [{"name": artifact.input_name, "data_type": "TYPE_FP32", "format": "FORMAT_NONE",
                       "dims": [3, crop, crop], "is_shape_tensor": False, "allow_ragged_batch": False,
                       "optional": False, "is_non_linear_format_io": False}],
            "output": [{"name": artifact.output_name, "data_type": "TYPE_FP32", "dims": [artifact.num_classes],
                        "label_filename": LABELS_FILE if artifact.labels else "", "is_shape_tensor": False,
                        "is_non_linear_format_io": False}]}


def model_config(service: Service, model_version: ModelVersion) -> dict[str, Any]:
    """Triton's JSON form of config.pbtxt, saying what this server does: ``max_batch_size`` the enforced
    per-request limit; ``preferred_batch_size`` the engine's batch sizes, the only ones the batcher runs (the
    largest the queue fills); ``max_queue_delay_microseconds`` 0, as a request never waits for a batch while an
    inference thread is idle (with several threads, one that finds a part batch while another batch runs waits up
    to ``--max-wait-ms``: ``parameters.busy_fill_wait_us``); one ``<model>_0`` group of the inference threads.

    Args:
        service: the process's service (settings, host policies).
        model_version: the version asked about.

    Returns:
        The configuration.
    """
    artifact = model_version.artifact
    assert artifact is not None
    settings = service.settings
    info = model_version.info
    name, backend = platform(model_version)
    gpu = bool(info and info.device == "cuda")
    return {
        "name": model_version.name, "platform": name, "backend": backend, "runtime": "",
        "version_policy": service.host.policy_config(model_version.name), "max_batch_size": max_images(service),
        **_io(model_version), "batch_input": [], "batch_output": [], "optimization": dict(OPTIMIZATION),
        "dynamic_batching": {"preferred_batch_size": list(info.batch_sizes) if info else [],
                             "max_queue_delay_microseconds": 0, "preserve_ordering": False,
                             "priority_levels": 0, "default_priority_level": 0, "priority_queue_policy": {}},
        "instance_group": [{"name": f"{model_version.name}_0", "kind": "KIND_GPU" if gpu else "KIND_CPU",
                            "count": settings.resolved_inference_threads(), "gpus": [0] if gpu else [],
                            "secondary_devices": [], "profile": [], "passive": False, "host_policy": ""}],
        "default_model_filename": "model.plan" if backend == "tensorrt" else artifact.onnx_file,
        "cc_model_filenames": {}, "metric_tags": {},
        "parameters": {"busy_fill_wait_us": {"string_value": str(int(settings.max_wait_ms * 1000))}},
        "model_warmup": []}


def statistics(service: Service, name: str | None = None, version: str | None = None) -> dict[str, Any]:
    """Triton's statistics extension: every model's versions, one model's, or one version's (blocking with
    ``--frontends``, where the engine process counts: call it in a thread).

    Args:
        service: the process's service.
        name: one model (None: every model).
        version: one version of it (None: every version).

    Returns:
        ``{"model_stats": [...]}`` as Triton answers it.

    Raises:
        APIError: 400 for a model or version not served (Triton's answer).
    """
    if name:
        try:
            mine = [service.model(name, version)] if version else \
                [served for served in service.host.versions() if served.name == service.model(name).name]
        except APIError as e:
            if e.status != 404:
                raise
            raise APIError(400, "not_found", f"requested model '{name}' is not available ({e.message})") from None
    else:
        mine = service.host.versions()
    return {"model_stats": [served.batcher.stats.to_triton(served.name, str(served.version)) for served in mine
                            if served.batcher is not None]}


def metric_stats(service: Service) -> list[dict[str, Any]]:
    """Every served version's statistics with ``fail_reasons`` (and ``pending`` where the queue is in this
    process), for Triton's ``nv_inference_*`` metrics (blocking with ``--frontends``: call it in a thread)."""
    out = []
    for model_version in service.host.versions():
        if model_version.batcher is not None:
            stats = model_version.batcher.stats.to_triton(model_version.name, str(model_version.version), reasons=True)
            pending = getattr(model_version.batcher, "pending", None)
            out.append(stats if pending is None else {**stats, "pending": pending})
    return out


def model_ready(service: Service, name: str, version: str | None = None) -> bool:
    """Whether a model (version) is loaded and warm.

    Args:
        service: the process's service.
        name: the model.
        version: the version (None: any).

    Returns:
        True when it serves now.

    Raises:
        APIError: 404 for a model the repository does not hold.
    """
    try:
        return service.model(name, version).ready
    except APIError:
        if name not in service.host.catalog():
            raise
        return False


def repository_index(service: Service, ready_only: bool = False) -> list[dict[str, str]]:
    """Triton's model repository index.

    Args:
        service: the process's service.
        ready_only: only the READY versions.

    Returns:
        Every model and version, its state and the reason.
    """
    return [row for row in service.host.index() if not ready_only or row.get("state") == VersionState.READY]


def random_id(bits: int = 128) -> str:
    """A random id of ``bits`` bits in lower-case hex: an answer's ``id`` when the request had none, request and
    trace ids (``random.getrandbits``, as OpenTelemetry's own id generator: ids need to be unique, not secret;
    ``uuid4`` and ``secrets`` cost a getrandom syscall each)."""
    return f"{random.getrandbits(bits) or 1:0{bits // 4}x}"


def max_images(service: Service) -> int:
    """The most images one inference request may carry: the model config's ``max_batch_size``, enforced by
    :func:`check_images` (``--max-images``, at most ``--max-queue``).

    Args:
        service: the process's service.

    Returns:
        The limit.
    """
    settings = service.settings
    return min(settings.max_images, settings.max_queue)


def count(value: object, what: str) -> int:
    """A non-negative integer the client sent (bool, float and string refused)."""
    if type(value) is not int or value < 0:
        raise ProtocolError(f"{what} must be a non-negative integer, got {value!r}")
    return value


def check_input(name: object, datatype: object, shape: object, artifact: ModelArtifact) -> list[int]:
    """The one input's name, datatype and shape [N,3,H,W] against the model metadata; the shape."""
    if name != artifact.input_name:
        raise ProtocolError(f"unexpected inference input {name!r} for model {artifact.name!r}; "
                            f"the model has {artifact.input_name!r}")
    if datatype != DATATYPE:
        raise ProtocolError(f"inference input {artifact.input_name!r} data-type is {datatype!r}, "
                            f"but model {artifact.name!r} expects {DATATYPE!r}")
    want = [3, artifact.preprocess.crop, artifact.preprocess.crop]
    if not (isinstance(shape, list) and len(shape) == 4 and shape[1:] == want and type(shape[0]) is int
            and shape[0] >= 1 and all(type(d) is int for d in shape)):
        raise ProtocolError(f"unexpected shape for input {artifact.input_name!r} for model {artifact.name!r}: expected "
                            f"[N,{want[0]},{want[1]},{want[2]}] with N >= 1, got {quoted(shape)}")
    return shape


def quoted(value: object, items: int = 8, chars: int = 200) -> str:
    """``value`` as an error message quotes it, bounded: a list's first ``items`` items and its length, at most
    ``chars`` characters of anything else (a client's value may be megabytes)."""
    if isinstance(value, list) and len(value) > items:
        return f"[{', '.join(str(v)[:20] for v in value[:items])}, ...] ({len(value)} items)"
    text = str(value)
    return text if len(text) <= chars else f"{text[:chars]}... ({len(text)} characters)"


def check_batch(images: int, max_images: int) -> None:
    """400 for a request of more than ``max_images`` images (the model config's ``max_batch_size``)."""
    if images > max_images:
        raise ProtocolError(f"inference request batch-size must be <= {max_images}, got {images} (the model "
                            "config's max_batch_size, --max-images)")


def check_images(images: np.ndarray, max_images: int) -> np.ndarray:
    """At most ``max_images`` images (:func:`max_images`: Triton's 400), finite values only (400)."""
    check_batch(len(images), max_images)
    if not all_finite(images):
        raise ProtocolError(f"input data has {int((~np.isfinite(images)).sum())} non-finite value(s) (NaN or "
                            "+-Inf, or beyond the FP32 range); this server accepts finite numbers only")
    return images


def classification(name: object, params: dict[str, Any], artifact: ModelArtifact, requested: int) -> int:
    """The classification extension's k for one requested output (0: the logits themselves); ``requested``:
    how many outputs the request lists (the model has one, which may be asked for once)."""
    if requested > 1:
        raise ProtocolError(f"{requested} outputs requested; model {artifact.name!r} has one output "
                            f"{artifact.output_name!r}, which may be requested once")
    if name != artifact.output_name:
        raise ProtocolError(f"unexpected inference output {name!r} for model {artifact.name!r}; "
                            f"the model has {artifact.output_name!r}")
    return min(count(params.get("classification", 0), "output parameters.classification"), artifact.num_classes)


def classes(logits: np.ndarray, k: int, labels: list[str]) -> list[str]:
    """Triton's classification strings ``"score:index:label"``, best first, ``k`` per image (row-major)."""
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return [f"{logits[n, i]:f}:{i}:{labels[i]}" for n in range(len(logits)) for i in order[n]]


def bytes_tensor(strings: list[str]) -> bytes:
    """A BYTES tensor's binary form: each element as a 4-byte little-endian length and its bytes."""
    return b"".join(len(b).to_bytes(4, "little") + b for b in (settings.encode() for settings in strings))


async def infer(service: Service, model_version: ModelVersion, images: np.ndarray, started: float) -> np.ndarray:
    """Run checked images on a model version's batcher, within the request deadline.

    Args:
        service: the process's service.
        model_version: the version the request holds.
        images: float32 [N, 3, H, W], checked (:func:`check_images`).
        started: when the request started (``time.perf_counter()``).

    Returns:
        The logits [N, classes].

    Raises:
        APIError: 503 (queue full, stopping), 504 past the deadline.
        ProtocolError: 400 when the model output is not finite.
    """
    results = await service.infer(list(images), model_version, started)
    logits = results[0].logits[None] if len(results) == 1 else np.stack([r.logits for r in results])
    if not all_finite(logits):  # finite but extreme input can overflow inside the model
        raise ProtocolError("the model output is not finite for this input (values too large?)")
    return logits


class ShmRef(NamedTuple):
    """Where a tensor lies in a registered client shared-memory region (Triton's system shared memory)."""

    region: str
    offset: int
    size: int


def shm_ref(params: dict[str, Any], where: str) -> ShmRef | None:
    """``shared_memory_region``/``_offset``/``_byte_size`` of an input's or output's parameters, or None."""
    region = params.get("shared_memory_region")
    if region is None:
        return None
    if not isinstance(region, str):
        raise ProtocolError(f"{where}.parameters.shared_memory_region must be a string, got {region!r}")
    if "shared_memory_byte_size" not in params:
        raise ProtocolError(f"{where} names shared memory region {region!r} without shared_memory_byte_size")
    size = count(params["shared_memory_byte_size"], f"{where}.parameters.shared_memory_byte_size")
    return ShmRef(region, count(params.get("shared_memory_offset", 0), f"{where}.parameters.shared_memory_offset"),
                  size)


def shm_input(shm: OwnedRegions, ref: ShmRef, name: str, shape: list[int], max_images: int) -> np.ndarray:
    """The checked FP32 input of ``shape`` read from its region (blocking: call it in a thread, never on the event
    loop). The batch size, the byte size against the shape, and the span inside the region are checked before
    a byte is read.

    Raises:
        ProtocolError: 400 for a batch over ``max_images``, a byte size other than the shape's, non-finite data.
        APIError: 404 for a region this client has not registered, 400 outside it.
    """
    check_batch(shape[0], max_images)
    want = math.prod(shape) * 4
    if ref.size != want:
        raise ProtocolError(f"input byte size mismatch for input {name!r}: expected {want} bytes for shape "
                            f"{shape} (FP32), got shared_memory_byte_size {ref.size}")
    shm.check(ref.region, ref.offset, ref.size)
    return check_images(shm.read_array(ref.region, ref.offset, ref.size, "<f4", shape), max_images)


def shm_output(shm: OwnedRegions, ref: ShmRef, name: str, logits: np.ndarray) -> None:
    """Write the FP32 logits into the region the requested output names (it must hold them)."""
    flat = np.ascontiguousarray(logits, dtype="<f4")
    shm_fits(ref, name, flat.nbytes)
    shm.write(ref.region, ref.offset, flat.tobytes())


def shm_fits(ref: ShmRef, name: str, nbytes: int) -> None:
    """An output region must hold the ``nbytes`` of the answer."""
    if ref.size < nbytes:
        raise ProtocolError(f"shared memory size specified with the request for output {name!r} ({ref.size} "
                            f"bytes) should be at least {nbytes} bytes to hold the results")
