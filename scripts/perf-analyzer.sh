#!/usr/bin/env bash
# Run NVIDIA's perf_analyzer (PyPI `perf-analyzer`, unchanged) against `irpe serve`.
#
# The PyPI wheel is built for glibc 2.38 (manylinux_2_38); Debian 12 has 2.36. So it runs in a podman
# container made from a Debian trixie rootfs (debootstrap, no registry needed), sharing the host network.
# The image is built once and reused (IRPE_PA_IMAGE); the wheel is fetched with the host's pip.
#
# Usage: scripts/perf-analyzer.sh [perf_analyzer args...]
#        scripts/perf-analyzer.sh --image   build the image if it is missing, print its name (scripts/test.sh)
#   scripts/perf-analyzer.sh -m deit_tiny -u 127.0.0.1:8000 --input-data zero --concurrency-range 1:32:31
# IRPE_PA_TIMEOUT (default 600 s): perf_analyzer is killed inside its container after that long, and the
# container is removed when this script ends however it ends (a killed client used to leave a perf_analyzer
# running, once at 19 GB RSS). IRPE_PA_MEMORY (default 12g): the container's memory cap; perf_analyzer 2.60
# has grown to 23.6 GB here at HTTP concurrency 32 (the kernel's OOM killer then took the server under test
# with it), and under the cap only perf_analyzer is killed.
# Needs root, podman, runc, debootstrap; /etc/containers/containers.conf with
#   [containers]
#   default_ulimits = []
set -euo pipefail
cd "$(dirname "$0")/.."
version="${PERF_ANALYZER_VERSION:-2.60.0}"
image="${IRPE_PA_IMAGE:-localhost/irpe-perf-analyzer:$version}"
suite="${IRPE_PA_SUITE:-trixie}"
mirror="${IRPE_PA_MIRROR:-http://deb.debian.org/debian}"
podman=(podman --runtime runc)

if ! grep -qs '^default_ulimits *= *\[\]' /etc/containers/containers.conf; then
  echo "perf-analyzer.sh: /etc/containers/containers.conf needs '[containers]' / 'default_ulimits = []'" >&2
  exit 2
fi

if ! "${podman[@]}" image exists "$image"; then
  work="$(mktemp -d /var/tmp/irpe-pa.XXXXXX)"
  trap 'rm -rf "$work"' EXIT
  echo "building $image: debootstrap $suite (a few minutes, once) ..." >&2
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$suite" "$work/root" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  mkdir -p "$work/wheels"
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 \
    --python-version 3.13 -d "$work/wheels" "perf-analyzer==$version"
  tar -C "$work/root" -c . | "${podman[@]}" import - "$image-base" > /dev/null
  "${podman[@]}" run --name irpe-pa-build -v "$work/wheels:/wheels:ro" "$image-base" \
    sh -c 'python3 -m venv /opt/pa && /opt/pa/bin/pip install -q --no-index /wheels/perf_analyzer-*.whl'
  "${podman[@]}" commit irpe-pa-build "$image" > /dev/null
  "${podman[@]}" rm irpe-pa-build > /dev/null
  "${podman[@]}" rmi "$image-base" > /dev/null
fi
if [ "${1:-}" = "--image" ]; then
  echo "$image"
  exit 0
fi

limit="${IRPE_PA_TIMEOUT:-600}"
name="irpe-pa-$$-$RANDOM"
trap 'rm -rf "${work:-/nonexistent}"; "${podman[@]}" rm -f -t 0 "$name" >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
rc=0
cd "${TMPDIR:-/tmp}"  # conmon leaves an empty file named "oom" in the working directory when the cap is hit
# the binary itself: the wheel's /opt/pa/bin/perf_analyzer wrapper runs it and exits 0 whatever it returned
# (perf_analyzer's own code on an error is 99)
"${podman[@]}" run --rm --name "$name" --network host --memory "${IRPE_PA_MEMORY:-12g}" "$image" \
  sh -c 'exec timeout --kill-after=5 "$0" /opt/pa/lib/python3*/site-packages/perf_analyzer/bin/perf_analyzer "$@"' \
  "$limit" "$@" || rc=$?
[ "$rc" != 124 ] || echo "perf-analyzer.sh: perf_analyzer ran past IRPE_PA_TIMEOUT=${limit}s and was stopped" >&2
exit "$rc"
