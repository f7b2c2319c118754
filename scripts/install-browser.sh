#!/usr/bin/env bash
# Install Debian's chromium for tests/reliability/test_browser.py (driven by Playwright, no `playwright install`).
# Idempotent and quiet. Without root/apt/network it prints why and exits 0 (the browser test then skips,
# naming what is missing), except with --required or IRPE_CI=1 (CI): then it exits 1.
set -u
required=0
if [ "${1:-}" = "--required" ] || { [ -n "${IRPE_CI:-}" ] && [ "${IRPE_CI}" != 0 ]; }; then
  required=1
fi
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
say() { echo "install-browser: $*" >&2; }
fail() { [ "$required" = 1 ] && exit 1; exit 0; }
if ! command -v apt-get >/dev/null 2>&1; then
  say "apt-get not found; install chromium yourself to run the browser test"
  fail
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
  else
    say "not root and no passwordless sudo; the browser test will be skipped"
    fail
  fi
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Only refresh the package lists when chromium is not known yet (keeps repeated runs fast).
if ! apt-cache show chromium >/dev/null 2>&1; then
  timeout 300 $sudo apt-get update -qq >"$log" 2>&1 || { say "apt-get update failed:"; tail -n 3 "$log" >&2; }
fi
if timeout 900 $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >"$log" 2>&1 \
   && [ -x /usr/bin/chromium ]; then
  say "installed $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
else
  say "could not install chromium (the browser test will be skipped):"
  tail -n 3 "$log" >&2
  fail
fi
exit 0
