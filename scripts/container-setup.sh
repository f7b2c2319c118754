#!/usr/bin/env bash
# A container engine for tests/deploy/test_container.py, a set-up step of scripts/test.sh: a running Docker
# engine is used as is; otherwise Debian's podman + runc, catatonit (the pause process of `podman kube play`'s
# pods: tests/deploy/test_pod.py), podman-compose (tests/deploy/test_docker_steps.py) and debootstrap (for
# scripts/container-base.sh) are installed as root, and containers.conf gets `default_ulimits = []` (podman's
# default raises rlimits, which sandboxes like this one forbid). Quick when already done. When it cannot, one
# line says what is missing, how to install it and how to run the suite without the container tests
# (IRPE_TEST_WITHOUT=container); exit 1.
set -euo pipefail
TAG=container-setup GROUP=container
# shellcheck source=setup-lib.sh
source "$(dirname "$0")/setup-lib.sh"
if command -v docker >/dev/null 2>&1 && timeout 60 docker info >/dev/null 2>&1; then
  say "docker engine running; nothing to install"
  exit 0
fi
missing=""
for tool in podman runc catatonit podman-compose debootstrap; do
  command -v "$tool" >/dev/null 2>&1 || missing+=" $tool"
done
if [ -n "$missing" ]; then
  start=$SECONDS
  list="${missing# }"
  # shellcheck disable=SC2086
  apt_install "no running docker engine and no ${list// /, }" $missing
  say "installed$missing ($(podman --version)) in $((SECONDS - start))s"
fi
conf=/etc/containers/containers.conf
if ! grep -qs '^default_ulimits *= *\[\]' "$conf"; then
  as_root "podman needs default_ulimits = [] in $conf" \
    "printf '[containers]\\ndefault_ulimits = []\\n' >> $conf (or add the line under [containers])"
  $SUDO mkdir -p /etc/containers
  if grep -qs '^\[containers\]' "$conf"; then
    $SUDO sed -i 's/^\[containers\]/[containers]\ndefault_ulimits = []/' "$conf"
  else
    printf '[containers]\ndefault_ulimits = []\n' | $SUDO tee -a "$conf" >/dev/null
  fi
  say "wrote default_ulimits = [] to $conf"
fi
if ! err="$(timeout 120 podman --runtime runc info 2>&1 >/dev/null)"; then
  cannot "podman --runtime runc info fails: $(tail -n 1 <<<"$err")" \
    "see podman's message; docker with a running daemon works too"
fi
