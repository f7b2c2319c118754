# syntax=docker/dockerfile:1
# irpe-deploy serving image (torch-free): `irpe serve /models`.
#   GPU (default):  docker build -t irpe-serve:gpu .
#   GPU + TensorRT: docker build --build-arg TENSORRT=1 -t irpe-serve:trt .
#   CPU:            docker build --build-arg VARIANT=cpu -t irpe-serve:cpu .
#   Run:            docker run --gpus all -p 8000:8000 -v $PWD/artifacts:/models irpe-serve:gpu
# Extra `irpe serve` flags go after the image name; every setting is also an IRPE_* variable.
ARG VARIANT=gpu
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu22.04
ARG PYTHON_IMAGE=python:3.11-slim

# --- GPU base: CUDA 12 + cuDNN 9 libraries, onnxruntime-gpu ---
FROM ${CUDA_IMAGE} AS base-gpu
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV IRPE_EXTRA=gpu IRPE_DEVICE=cuda

# --- CPU base ---
FROM ${PYTHON_IMAGE} AS base-cpu
RUN python -m venv /opt/venv
ENV IRPE_EXTRA="" IRPE_DEVICE=cpu

# --- build the wheel on the same base (same Python): the exact-resize C kernels need a compiler ---
# hadolint ignore=DL3006
FROM base-${VARIANT} AS wheel
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && if [ "$IRPE_DEVICE" = "cuda" ]; then apt-get install -y --no-install-recommends python3-dev; fi \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY irpe ./irpe
COPY artifact ./artifact
COPY server ./server
COPY models ./models
COPY export ./export
COPY plugins ./plugins
COPY training ./training
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/python -c "import glob, sys, zipfile; names = zipfile.ZipFile(glob.glob('/wheels/*.whl')[0]).namelist(); sys.exit(not any('_resample' in n for n in names))"

# --- final image, from the variant picked with --build-arg VARIANT=gpu|cpu ---
# hadolint ignore=DL3006
FROM base-${VARIANT} AS final
ARG TENSORRT=0
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    IRPE_HOST=0.0.0.0 \
    IRPE_PORT=8000 \
    IRPE_ARTIFACT_DIR=/models
COPY --from=wheel /wheels /wheels
SHELL ["/bin/sh", "-eu", "-c"]
# onnxruntime and onnxruntime-gpu share a module name: the GPU image keeps only onnxruntime-gpu.
# hadolint ignore=DL3013
RUN wheel="$(ls /wheels/irpe_deploy-*.whl)" \
    && if [ -n "$IRPE_EXTRA" ]; then \
         pip install --no-cache-dir "${wheel}[${IRPE_EXTRA}]" \
         && pip uninstall -y onnxruntime \
         && pip install --no-cache-dir --force-reinstall --no-deps onnxruntime-gpu; \
       else \
         pip install --no-cache-dir "${wheel}"; \
       fi \
    && if [ "$TENSORRT" = "1" ]; then pip install --no-cache-dir 'tensorrt-cu12>=10.9,<12' cuda-python; fi \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin irpe \
    && mkdir -p /models \
    && chown irpe /models
USER 10001
WORKDIR /models
VOLUME ["/models"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('IRPE_PORT', '8000') + '/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["irpe", "serve", "/models"]
CMD []
