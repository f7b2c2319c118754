#!/usr/bin/env bash
# Debian's haproxy and iproute2 for tests/deploy/test_haproxy.py (deploy/haproxy/haproxy.cfg in front of three
# `irpe serve` hosts in network namespaces the test makes; the namespaces need root when the test runs).
# A set-up step of scripts/test.sh: nothing to do when both are there; else apt-get as root (or with
# passwordless sudo). When it cannot, one line says what is missing, how to install it and how to run the
# suite without the balancer tests (IRPE_TEST_WITHOUT=balancer), and it exits 1.
set -euo pipefail
TAG=install-haproxy GROUP=balancer
# shellcheck source=setup-lib.sh
source "$(dirname "$0")/setup-lib.sh"
have() { command -v haproxy >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; }
have && exit 0
apt_install "no haproxy or no ip (iproute2)" haproxy iproute2
have || cannot "apt-get installed haproxy but it is not on PATH" "apt-get install --reinstall haproxy"
say "installed $(haproxy -v 2>/dev/null | head -n 1)"
