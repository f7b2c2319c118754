#!/bin/sh
# Runs inside the Dockerfile's final stage (as root): installs the irpe-deploy wheel from /wheels into /opt/venv.
#   Both: the `grpc` extra (the gRPC front end).
#   IRPE_DEVICE=cpu:  the wheel + onnxruntime==$ORT_VERSION (+ the extras in $CPU_EXTRAS).
#   IRPE_DEVICE=cuda: the wheel's serving deps (and the grpc extra's) with onnxruntime-gpu[cuda,cudnn]==
#                     $ORT_GPU_VERSION in place of onnxruntime (same module name; CUDA + cuDNN arrive as nvidia-* wheels), TensorRT and
#                     cuda-python when TENSORRT=1, and the wheels' library folders registered with ldconfig.
set -eu
wheel="$(ls /wheels/irpe_deploy-*.whl)"
pip_install() { pip install --no-cache-dir --disable-pip-version-check "$@"; }

if [ "$IRPE_DEVICE" = cpu ]; then
  pip_install "${wheel}[grpc${CPU_EXTRAS:+,$CPU_EXTRAS}]" "onnxruntime==${ORT_VERSION}"
else
  pip_install --no-deps "$wheel"
  # the wheel's own runtime requirements and the grpc extra's, less onnxruntime (markers kept, other extras dropped)
  python - > /tmp/requirements.txt <<'EOF'
import re
from importlib.metadata import requires
for req in requires("irpe-deploy") or []:
    spec, _, marker = req.partition(";")
    if re.split(r"[ ;<>=!~\[]", req, maxsplit=1)[0] == "onnxruntime":
        continue
    if "extra ==" not in marker:
        print(req)
    elif marker.strip() in ('extra == "grpc"', "extra == 'grpc'"):
        print(spec.strip())
EOF
  pip_install -r /tmp/requirements.txt "onnxruntime-gpu[cuda,cudnn]==${ORT_GPU_VERSION}"
  rm /tmp/requirements.txt
  if [ "$TENSORRT" = 1 ]; then
    pip_install "${TENSORRT_PACKAGE}==${TENSORRT_VERSION}" "cuda-python==${CUDA_PYTHON_VERSION}"
  fi
  site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  find "$site/nvidia" "$site/tensorrt_libs" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u \
    > /etc/ld.so.conf.d/irpe-cuda-wheels.conf
  ldconfig
fi
# not needed at run time: NumPy's own test suite, setuptools, and (last) pip itself
site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
find "$site/numpy" -type d -name tests -prune -exec rm -rf {} +
# OpenVINO (CPU_EXTRAS): the server compiles on "CPU" from ONNX only, so the Intel GPU/NPU plugins (and their
# kernel cache), the AUTO/HETERO/batch plugins, every frontend but ONNX, the converter tools, headers, stubs and
# CMake files go: 180 MB -> ~97 MB (2026.4; fp32, bf16 and int8 still compile on CPU).
ov="$site/openvino"
if [ -d "$ov/libs" ]; then
  rm -f "$ov"/libs/cache.json "$ov"/libs/libopenvino_intel_gpu_plugin.so "$ov"/libs/libopenvino_intel_npu_plugin.so \
        "$ov"/libs/libopenvino_auto_plugin.so "$ov"/libs/libopenvino_auto_batch_plugin.so \
        "$ov"/libs/libopenvino_hetero_plugin.so
  for fe in tensorflow tensorflow_lite pytorch paddle jax gguf; do rm -f "$ov"/libs/libopenvino_${fe}_frontend.so*; done
  rm -rf "$ov"/include "$ov"/cmake "$ov"/frontend/tensorflow "$ov"/frontend/pytorch "$ov"/frontend/paddle \
         "$ov"/frontend/jax "$ov"/torch "$ov"/tools
  find "$ov" -name '*.pyi' -delete
fi
# debug symbols of the wheels' Python extensions (ml_dtypes, a need of the grpc extra's stubs: 25 -> 1.5 MB; uvloop
# 11 MB; python-rapidjson 6 MB; Pillow, NumPy): stripped with binutils, installed and purged in this one layer.
# ONNX Runtime, OpenVINO, the CUDA/TensorRT wheels and auditwheel's vendored *.libs (patched ELF: stripping
# breaks their loading) are left as shipped.
if command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends binutils >/dev/null
  find "$site" -name '*.so*' -type f -not -path '*/openvino/*' -not -path '*/onnxruntime/*' \
       -not -path '*/nvidia/*' -not -path '*/tensorrt*' -not -path '*.libs/*' -exec strip --strip-unneeded {} + 2>/dev/null || true
  apt-get purge -y -qq --auto-remove binutils >/dev/null
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
fi
pip uninstall -y -q setuptools 2>/dev/null || true
pip uninstall -y -q pip
