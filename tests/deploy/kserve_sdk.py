"""Strict check of KServe manifests against the kserve SDK's models, run in its own process
(``python -m tests.deploy.kserve_sdk`` with a JSON list of documents on stdin; prints one JSON verdict per document).

Own process because ``import kserve`` registers KServe's v2 gRPC messages (package ``inference``) in protobuf's
default pool, and tritonclient's ``service_pb2`` registers Triton's under the same names: one process cannot import
both (``duplicate symbol 'inference.ServerLiveRequest'``), and the test suite imports tritonclient.grpc.
Every field must be one the SDK's model for that spot declares, with its type; the generated models refuse a
missing required field. Kubernetes types inside (V1Container, ...) come from kubernetes.client.models.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import kserve.models as kserve_models
import kubernetes.client.models as k8s_models

KINDS = {"ServingRuntime": ("serving.kserve.io/v1alpha1", "V1alpha1ServingRuntime"),
         "InferenceService": ("serving.kserve.io/v1beta1", "V1beta1InferenceService")}
PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "object": (object,),
              "ResourceQuantity": (str,)}  # quantities: quoted strings ("4", 4Gi) in these manifests


class ManifestError(ValueError):
    """A manifest field the SDK's models do not accept."""


def _model_class(name: str) -> type:
    for module in (kserve_models, k8s_models):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(f"{name}: neither kserve.models nor kubernetes.client.models defines it")


def _check(value: Any, type_name: str, path: str) -> Any:
    """``value`` as the SDK's ``type_name`` ('str', 'list[V1Container]', 'dict(str, str)', a model class)."""
    if m := re.fullmatch(r"[Ll]ist\[(.+)\]", type_name):
        if not isinstance(value, list):
            raise ManifestError(f"{path}: expected a list, got {value!r}")
        return [_check(v, m[1], f"{path}[{i}]") for i, v in enumerate(value)]
    if m := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_name):
        if not isinstance(value, dict):
            raise ManifestError(f"{path}: expected a mapping, got {value!r}")
        return {k: _check(v, m[1] or m[2], f"{path}.{k}") for k, v in value.items()}
    if type_name in PRIMITIVES:
        bad_bool = type_name in ("int", "float") and isinstance(value, bool)
        if bad_bool or not isinstance(value, PRIMITIVES[type_name]):
            raise ManifestError(f"{path}: expected {type_name}, got {value!r}")
        return value
    cls = _model_class(type_name)
    if not isinstance(value, dict):
        raise ManifestError(f"{path}: expected a {type_name} mapping, got {value!r}")
    fields = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ManifestError(f"{path}: {type_name} has no field {', '.join(unknown)}")
    kwargs = {fields[k]: _check(v, cls.openapi_types[fields[k]], f"{path}.{k}") for k, v in value.items()}
    try:
        return cls(**kwargs)  # the generated models refuse a missing required field (client-side validation)
    except ValueError as e:
        raise ManifestError(f"{path}: {e}") from e


def check_kserve(doc: dict) -> Any:
    """The SDK model for ``doc`` (ServingRuntime or InferenceService), or ManifestError naming the field."""
    api_version, class_name = KINDS[doc.get("kind", "?")]
    if doc.get("apiVersion") != api_version:
        raise ManifestError(f"{doc['kind']}: apiVersion must be {api_version}, got {doc.get('apiVersion')!r}")
    return _check(doc, class_name, doc["kind"])



def main() -> int:
    verdicts = []
    for doc in json.load(sys.stdin):
        try:
            verdicts.append({"ok": type(check_kserve(doc)).__name__})
        except ManifestError as e:
            verdicts.append({"error": str(e)})
    print(json.dumps(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
