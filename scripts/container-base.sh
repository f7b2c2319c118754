#!/usr/bin/env bash
# Make the Python base image for the serving image, and print its name on stdout.
#   - the pinned python:3.11-slim from Docker Hub when a registry answers (already present or pullable);
#   - otherwise a stand-in built locally (once, then cached in the engine's image store): a Debian
#     bookworm minbase rootfs (debootstrap) with Debian's Python 3.11, venv and pip, imported as an image.
# Usage: scripts/container-base.sh [ENGINE]   (ENGINE: docker or podman; default: the first one that runs)
# Env: PYTHON_IMAGE (the registry image to try), IRPE_BASE_IMAGE (local name), DEBIAN_MIRROR.
set -euo pipefail
python_image="${PYTHON_IMAGE:-python:3.11.13-slim-bookworm}"
local_image="${IRPE_BASE_IMAGE:-localhost/irpe-python-base:3.11-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
say() { echo "container-base: $*" >&2; }

engine="${1:-}"
if [ -z "$engine" ]; then
  for e in docker podman; do
    if command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1; then engine="$e"; break; fi
  done
fi
[ -n "$engine" ] || { say "neither docker nor podman runs here"; exit 1; }
run=("$engine")
[ "$engine" = podman ] && run+=(--runtime "${IRPE_OCI_RUNTIME:-runc}")

if "${run[@]}" image inspect "$python_image" >/dev/null 2>&1 \
   || timeout 120 "${run[@]}" pull -q "$python_image" >/dev/null 2>&1; then
  echo "$python_image"
  exit 0
fi
if "${run[@]}" image inspect "$local_image" >/dev/null 2>&1; then
  echo "$local_image"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || { say "no registry answers and debootstrap is missing (apt-get install debootstrap)"; exit 1; }
[ "$(id -u)" = 0 ] || { say "debootstrap needs root"; exit 1; }
say "no registry answers ($python_image); building $local_image from $mirror"
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
  bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || { tail -n 20 "$rootfs.log" >&2; exit 1; }
rm -f "$rootfs.log"
# what a slim image leaves out: package caches and lists, docs, man pages, message translations
rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
  "$rootfs"/var/log/*.log
tar -C "$rootfs" -c . | "${run[@]}" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$local_image" >/dev/null
say "built $local_image in $((SECONDS - start))s"
echo "$local_image"
