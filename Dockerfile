# syntax=docker/dockerfile:1
# irpe-deploy serving image (torch-free): `irpe serve /models`. No nvidia/cuda base: the GPU variant gets
# CUDA and cuDNN as pip wheels (onnxruntime-gpu[cuda,cudnn]); the driver comes from the host through the
# NVIDIA container toolkit (`--gpus all`).
#   GPU (default):  docker build -t irpe-serve:gpu .
#   GPU + TensorRT: docker build --build-arg TENSORRT=1 -t irpe-serve:trt .
#   CPU:            docker build --build-arg VARIANT=cpu -t irpe-serve:cpu .
#   Run:            docker run --gpus all -p 8000:8000 -e IRPE_API_KEY=change-me -v $PWD/artifacts:/models:ro irpe-serve:gpu
# HTTP on 8000; KServe v2 / Triton gRPC on 8001 (publish it with -p 8001:8001; IRPE_GRPC_PORT=-1 turns it off).
# The image binds 0.0.0.0, so give it a key (IRPE_API_KEY; clients send `Authorization: Bearer <key>`), or
# opt out explicitly with IRPE_INSECURE=1. Extra `irpe serve` flags go after the image name; every setting
# is also an IRPE_* variable.
# Without a registry (podman): PYTHON_IMAGE=$(scripts/container-base.sh) builds a local Debian stand-in, then
#   podman build --format docker --network host -v /etc/ssl/certs:/etc/ssl/certs:ro --build-arg PYTHON_IMAGE=... .
ARG VARIANT=gpu
# Pinned base (same tag for both variants); pin a digest too (`@sha256:...`) for byte-identical rebuilds.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# --- Python base shared by every stage: a venv in /opt/venv ---
# hadolint ignore=DL3006
FROM ${PYTHON_IMAGE} AS python
RUN python3 -m venv /opt/venv

# --- the variants differ only in what the final stage installs ---
FROM python AS base-gpu
ENV IRPE_DEVICE=cuda

FROM python AS base-cpu
ENV IRPE_DEVICE=cpu

# --- build the wheel on the same base (same Python): the C kernels (exact resize, iRPE ops for ONNX Runtime) need a compiler ---
FROM python AS wheel
# python:*-slim ships Python.h; Debian's python3 needs python3-dev for it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && if ! python3 -c "import os, sys, sysconfig; sys.exit(not os.path.isfile(sysconfig.get_paths()['include'] + '/Python.h'))"; then \
         apt-get install -y --no-install-recommends python3-dev; \
       fi \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cli ./cli
COPY artifact ./artifact
COPY server ./server
COPY models ./models
COPY export ./export
COPY plugins ./plugins
COPY training ./training
COPY bench ./bench
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/python -c "import glob, sys, zipfile; names = zipfile.ZipFile(glob.glob('/wheels/*.whl')[0]).namelist(); sys.exit(not all(any(k in n for n in names) for k in ('_resample', '_ortops')))"

# --- final image, from the variant picked with --build-arg VARIANT=gpu|cpu ---
# hadolint ignore=DL3006
FROM base-${VARIANT} AS final
# Extras of irpe-deploy for the CPU image (comma-separated): OpenVINO (`cpu`) by default; CPU_EXTRAS="" for ORT only.
# Every image also gets the `grpc` extra (the gRPC front end on IRPE_GRPC_PORT).
ARG CPU_EXTRAS="cpu"
# Pinned runtimes. onnxruntime-gpu 1.31 on PyPI is built for CUDA 13 + cuDNN 9 and its TensorRT provider links
# libnvinfer.so.10, so TensorRT is the -cu13 build of a 10.x release.
ARG ORT_VERSION=1.32.0
ARG ORT_GPU_VERSION=1.31.1
ARG TENSORRT=0
ARG TENSORRT_PACKAGE=tensorrt-cu13
ARG TENSORRT_VERSION=10.16.1.11
ARG CUDA_PYTHON_VERSION=13.4.4
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    IRPE_HOST=0.0.0.0 \
    IRPE_PORT=8000 \
    IRPE_GRPC_PORT=8001 \
    IRPE_ARTIFACT_DIR=/models \
    ORT_DISABLE_TELEMETRY=1
COPY --from=wheel /wheels /wheels
COPY scripts/image-install.sh /usr/local/lib/irpe/image-install.sh
SHELL ["/bin/sh", "-eu", "-c"]
RUN sh /usr/local/lib/irpe/image-install.sh \
    && rm -rf /wheels /usr/local/lib/irpe \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin irpe \
    && mkdir -p /models \
    && chown irpe /models
USER 10001
WORKDIR /models
VOLUME ["/models"]
EXPOSE 8000 8001
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('IRPE_PORT', '8000') + '/healthz', timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["irpe", "serve", "/models"]
CMD []
