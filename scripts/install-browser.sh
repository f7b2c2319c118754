#!/usr/bin/env bash
# Debian's chromium for tests/reliability/test_browser.py (Playwright drives it; no `playwright install`).
# A set-up step of scripts/test.sh: nothing to do when the browser is there; else apt-get as root (or with
# passwordless sudo). When it cannot, one line says what is missing, how to install it and how to run the
# suite without the browser tests (IRPE_TEST_WITHOUT=browser), and it exits 1.
set -euo pipefail
TAG=install-browser GROUP=browser
# shellcheck source=setup-lib.sh
source "$(dirname "$0")/setup-lib.sh"
chromium="${IRPE_CHROMIUM:-/usr/bin/chromium}"
[ -x "$chromium" ] && exit 0
[ "$chromium" = /usr/bin/chromium ] \
  || cannot "no chromium at IRPE_CHROMIUM=$chromium" "point IRPE_CHROMIUM at a chromium binary, or unset it"
apt_install "no chromium at /usr/bin/chromium" chromium fonts-dejavu-core
[ -x "$chromium" ] \
  || cannot "apt-get installed chromium but $chromium is not there" "apt-get install --reinstall chromium"
say "installed $("$chromium" --version 2>/dev/null || echo chromium)"
