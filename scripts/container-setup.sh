#!/usr/bin/env bash
# Make a container engine usable for the container test (tests/deploy/test_container.py), as root on Debian:
# a running Docker engine is used as is; otherwise Debian's podman + runc (and debootstrap for the local
# base image) are installed, and rlimits are left alone (this sandbox forbids raising them).
# Prints each step's time on stderr.
set -euo pipefail
say() { echo "container-setup: $*" >&2; }
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  say "docker engine running; nothing to install"
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  sudo -n true 2>/dev/null || { say "not root and no passwordless sudo: cannot install podman"; exit 1; }
  sudo="sudo -n"
fi
start=$SECONDS
if ! command -v podman >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-cache show podman >/dev/null 2>&1 || timeout 300 $sudo apt-get update -qq
  timeout 600 $sudo apt-get install -y -qq --no-install-recommends podman runc debootstrap >/dev/null
  say "installed $(podman --version) in $((SECONDS - start))s"
fi
conf=/etc/containers/containers.conf
if ! grep -qs '^default_ulimits *= *\[\]' "$conf"; then
  $sudo mkdir -p /etc/containers
  if grep -qs '^\[containers\]' "$conf"; then
    $sudo sed -i 's/^\[containers\]/[containers]\ndefault_ulimits = []/' "$conf"
  else
    printf '[containers]\ndefault_ulimits = []\n' | $sudo tee -a "$conf" >/dev/null
  fi
  say "wrote default_ulimits = [] to $conf"
fi
podman --runtime runc info >/dev/null
say "podman ready ($((SECONDS - start))s)"
