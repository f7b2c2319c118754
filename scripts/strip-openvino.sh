#!/usr/bin/env bash
# Remove from an installed OpenVINO wheel what a CPU-only server never loads: the GPU and NPU plugins (and the
# GPU kernel cache), the AUTO/HETERO/batching plugins, every model frontend but ONNX, the converter tools,
# headers, type stubs and CMake files. Usage: strip-openvino.sh [SITE_PACKAGES]
# (default: the site-packages of the python on PATH). Prints the size before and after.
set -euo pipefail
site="${1:-$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"
ov="$site/openvino"
[ -d "$ov/libs" ] || { echo "strip-openvino: no OpenVINO wheel in $site" >&2; exit 2; }
before=$(du -sm "$ov" | cut -f1)
rm -f "$ov"/libs/libopenvino_intel_gpu_plugin.so "$ov"/libs/libopenvino_intel_npu_plugin.so "$ov"/libs/cache.json \
      "$ov"/libs/libopenvino_auto_plugin.so "$ov"/libs/libopenvino_auto_batch_plugin.so \
      "$ov"/libs/libopenvino_hetero_plugin.so
for fe in tensorflow tensorflow_lite pytorch paddle jax gguf; do
  rm -f "$ov"/libs/libopenvino_${fe}_frontend.so*
done
rm -rf "$ov"/include "$ov"/cmake "$ov"/frontend/tensorflow "$ov"/frontend/pytorch "$ov"/frontend/paddle \
       "$ov"/frontend/jax "$ov"/torch "$ov"/tools
find "$ov" -name '*.pyi' -delete
after=$(du -sm "$ov" | cut -f1)
echo "strip-openvino: $ov ${before} MB -> ${after} MB"
