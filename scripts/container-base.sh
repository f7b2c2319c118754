#!/usr/bin/env bash
# Make the Python base image for the serving image, and print its name on stdout.
#   - an image already in the engine's store: the pinned python:3.11-slim, else the local stand-in below;
#   - else the pinned python:3.11-slim from Docker Hub when a registry answers;
#   - else a stand-in built locally (once, then cached in the engine's image store): a Debian bookworm
#     minbase rootfs (debootstrap, as root) with Debian's Python 3.11, venv and pip, imported as an image.
# `ENGINE rmi IMAGE` makes it look again. A set-up step of scripts/test.sh (the container tests build on it);
# when it cannot, one line says what is missing and how to run the suite without the container tests; exit 1.
# Usage: scripts/container-base.sh [ENGINE]   (ENGINE: docker or podman; default: the first one that runs)
# Env: PYTHON_IMAGE (the registry image to try), IRPE_BASE_IMAGE (local name), DEBIAN_MIRROR.
set -euo pipefail
TAG=container-base GROUP=container
# shellcheck source=setup-lib.sh
source "$(dirname "$0")/setup-lib.sh"
python_image="${PYTHON_IMAGE:-python:3.11.13-slim-bookworm}"
local_image="${IRPE_BASE_IMAGE:-localhost/irpe-python-base:3.11-bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

engine="${1:-}"
if [ -z "$engine" ]; then
  for e in docker podman; do
    if command -v "$e" >/dev/null 2>&1 && timeout 60 "$e" info >/dev/null 2>&1; then engine="$e"; break; fi
  done
fi
[ -n "$engine" ] || cannot "neither docker nor podman runs here" "scripts/container-setup.sh"
run=("$engine")
[ "$engine" = podman ] && run+=(--runtime "${IRPE_OCI_RUNTIME:-runc}")

for image in "$python_image" "$local_image"; do
  if "${run[@]}" image inspect "$image" >/dev/null 2>&1; then
    echo "$image"
    exit 0
  fi
done
if timeout 120 "${run[@]}" pull -q "$python_image" >/dev/null 2>&1; then
  echo "$python_image"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || cannot "no registry answers ($python_image) and debootstrap is missing" \
  "apt-get install debootstrap (scripts/container-setup.sh does), or a registry that serves $python_image"
[ "$(id -u)" = 0 ] || cannot "no registry answers ($python_image) and debootstrap needs root" \
  "run this script once as root, or a registry that serves $python_image"
say "no registry answers ($python_image); building $local_image from $mirror"
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs" "$rootfs.log"' EXIT
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
  bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
  || { tail -n 20 "$rootfs.log" >&2; cannot "debootstrap of bookworm from $mirror failed (above)" \
       "a reachable Debian mirror (DEBIAN_MIRROR=...), or a registry that serves $python_image"; }
# what a slim image leaves out: package caches and lists, docs, man pages, message translations
rm -rf "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
  "$rootfs"/var/log/*.log
tar -C "$rootfs" -c . | "${run[@]}" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$local_image" >/dev/null
say "built $local_image in $((SECONDS - start))s"
echo "$local_image"
