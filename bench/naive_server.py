"""The comparison baseline: a plain FastAPI server running one inference per request (no batching).

It is what one writes first: a sync endpoint (FastAPI's thread pool), decode + the reference preprocessing
(Pillow's resize and crop, same pixels as the served path),
``session.run`` on a batch of one with ONNX Runtime's default session options.
Run: ``python -m irpe.bench.naive_server ARTIFACT_DIR PORT``.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
from fastapi import FastAPI, File, UploadFile
from PIL import Image

from irpe.artifact import load_artifact
from irpe.artifact.preprocess import preprocess_image


def create_naive_app(artifact_dir: str | Path) -> FastAPI:
    """One request = one decode + one batch-1 inference."""
    import onnxruntime as ort

    art = load_artifact(artifact_dir)
    session = ort.InferenceSession(str(Path(artifact_dir) / art.onnx_file), providers=["CPUExecutionProvider"])
    app = FastAPI()

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        """Always ready once started."""
        return {"status": "ready"}

    @app.post("/classify")
    def classify(file: UploadFile = File(...)) -> dict[str, object]:
        """Decode, preprocess, run batch 1, top 5."""
        img = Image.open(io.BytesIO(file.file.read())).convert("RGB")
        x = preprocess_image(img, art.preprocess, accelerated=False)[None]
        (logits,) = session.run([art.output_name], {art.input_name: x})
        p = np.exp(logits[0] - logits[0].max())
        p /= p.sum()
        top = np.argsort(-p)[:5]
        return {"predictions": [[{"index": int(i), "label": art.labels[i], "probability": float(p[i])}
                                 for i in top]]}

    return app


def main() -> None:
    """Serve the naive app (argv: ARTIFACT_DIR PORT)."""
    import uvicorn

    uvicorn.run(create_naive_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
