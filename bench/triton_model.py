"""Triton Python-backend model that runs an exported ``model.onnx`` with ONNX Runtime (CPU).

Written next to ``model.onnx`` in the repository that :mod:`tritonserver` builds; it runs inside Triton's
Python stub (the system Python of the Triton environment), so it imports only NumPy, ONNX Runtime and
Triton's ``triton_python_backend_utils``. The config's ``parameters`` carry ``intra_op_threads``.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """One ONNX Runtime session per model instance; a dynamic batch is one ``session.run``."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(params.get("intra_op_threads", "1"))
        opts.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        try:
            logits = self.session.run([self.output_name], {self.input_name: np.concatenate(arrays)})[0]
        except Exception as e:  # noqa: BLE001 - every request of the batch gets the error
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))) for _ in requests]
        responses, start = [], 0
        for a in arrays:
            out = pb_utils.Tensor(self.output_name, logits[start:start + len(a)])
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += len(a)
        return responses
