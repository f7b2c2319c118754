# Sourced by the set-up steps of scripts/test.sh (install-browser.sh, container-setup.sh, container-base.sh).
# The caller sets TAG (its message prefix) and GROUP (the name IRPE_TEST_WITHOUT takes for its tests).
# A step that cannot be done prints one line: what is missing, how to install it, and how to run the suite
# without those tests on purpose; then it exits 1.

say() { echo "$TAG: $*" >&2; }

# cannot WHAT HOW: the one line, then exit 1.
cannot() {
  echo "$TAG: $1; to install: $2; to run the suite without the $GROUP tests on purpose:" \
    "IRPE_TEST_WITHOUT=$GROUP ./scripts/test.sh" >&2
  exit 1
}

# as_root WHAT HOW: set SUDO to "" (root) or "sudo -n" (passwordless sudo), or say why not (cannot).
as_root() {
  SUDO=""
  [ "$(id -u)" = 0 ] && return 0
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
    return 0
  fi
  cannot "$1, and this is not root (no passwordless sudo)" "as root: $2"
}

_apt() {  # apt-get quietly, waiting for another apt's lock; the output goes to $APT_LOG
  timeout 900 $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=300 "$@" \
    >>"$APT_LOG" 2>&1
}

# apt_install WHAT PKG...: install Debian packages (WHAT: what is missing, e.g. "no chromium at /usr/bin/chromium").
# The package lists are refreshed only when a package is unknown, or once more when the install fails (stale
# lists), so a machine that has them is not slowed down.
apt_install() {
  local what=$1 pkg updated=0
  shift
  local how="apt-get install -y --no-install-recommends $*"
  command -v apt-get >/dev/null 2>&1 || cannot "$what, and there is no apt-get" "$how on Debian/Ubuntu"
  as_root "$what" "$how"
  APT_LOG="$(mktemp)"
  for pkg in "$@"; do
    if ! apt-cache show "$pkg" >/dev/null 2>&1; then
      _apt update || true
      updated=1
      break
    fi
  done
  if ! _apt install -y --no-install-recommends "$@"; then
    local ok=0
    if [ "$updated" = 0 ]; then
      _apt update || true
      _apt install -y --no-install-recommends "$@" && ok=1
    fi
    if [ "$ok" = 0 ]; then
      tail -n 3 "$APT_LOG" >&2
      rm -f "$APT_LOG"
      cannot "$what, and apt-get could not install it (above)" "$how"
    fi
  fi
  rm -f "$APT_LOG"
}
