#!/usr/bin/env bash
# README's test command (.ci/run runs it and nothing else). From nothing, on a fresh Debian machine (root, Debian
# packages reachable), it sets up what the suite needs, then lints and runs it. Every set-up step is idempotent,
# quick when already done, and prints its time:
#   venv                  .venv with the export,train,plugins,dev,cpu,ray extras scripts/setup-venv.sh
#   browser               Debian's chromium (tests/reliability/test_browser.py) scripts/install-browser.sh
#   container engine      podman + runc + containers.conf, or a running docker  scripts/container-setup.sh
#   container base image  the Python base of the serving image (tests/deploy)   scripts/container-base.sh
#   perf_analyzer image   NVIDIA's perf_analyzer wheel in a trixie container     scripts/perf-analyzer.sh --image
#   haproxy               Debian's haproxy + iproute2 (tests/deploy/test_haproxy.py) scripts/install-haproxy.sh
# then ruff and `pytest -m "not slow"`; without arguments tests/training runs in a pytest process of its own (run
# after the server suite in one process it has crashed: docs/testing.md). Arguments go to one pytest process.
#
# IRPE_CI=1 (the default): the C resize extension must build; a set-up step that cannot be done stops the run
# with one line (what is missing, how to install it, how to run without those tests); any skip other than no
# GPU / no TensorRT fails the run (tests/conftest.py).
# IRPE_TEST_WITHOUT=browser,container,perf_analyzer,balancer: leave those steps out on purpose; the skip gate then
# accepts the skips of those tests only, and lists each one as "opted out". IRPE_CI=0: a failed step is reported, skips are tolerated.
set -euo pipefail
cd "$(dirname "$0")/.."
export IRPE_CI="${IRPE_CI:-1}"
export IRPE_TEST_WITHOUT="${IRPE_TEST_WITHOUT:-}"
groups=(browser container perf_analyzer balancer)

note() { echo "test.sh: $*" >&2; }
usec() { local t="${EPOCHREALTIME//[!0-9]/}"; echo "${t:-$((SECONDS * 1000000))}"; }
since() { local d=$(( $(usec) - $1 )); printf '%d.%01ds' $((d / 1000000)) $((d % 1000000 / 100000)); }
strict() { [ "$IRPE_CI" != 0 ]; }
without() { [[ ",$IRPE_TEST_WITHOUT," == *",$1,"* ]]; }

for g in ${IRPE_TEST_WITHOUT//,/ }; do
  [[ " ${groups[*]} " == *" $g "* ]] || { note "IRPE_TEST_WITHOUT: unknown '$g' (known: ${groups[*]})"; exit 2; }
done

# step NAME GROUP CMD...: run a set-up step and print its time. GROUP is the IRPE_TEST_WITHOUT name of the tests
# that need it ("" = all: its failure stops the run at once). Any other failed step stops the run after the
# set-up (IRPE_CI=1), so one run names everything missing; with IRPE_CI=0 the run goes on and those tests skip.
# Returns non-zero when the step was left out or failed.
setup_failed=()
step() {
  local name=$1 group=$2 t0 rc=0
  shift 2
  if [ -n "$group" ] && without "$group"; then
    note "$name: left out on purpose (IRPE_TEST_WITHOUT=$IRPE_TEST_WITHOUT); the $group tests skip, listed as opted out"
    return 1
  fi
  t0=$(usec)
  "$@" || rc=$?
  if [ "$rc" = 0 ]; then
    note "$name $(since "$t0")"
    return 0
  fi
  note "$name FAILED after $(since "$t0") (exit $rc)"
  [ -n "$group" ] || exit 1
  setup_failed+=("$name")
  strict || note "IRPE_CI=0: going on; the $group tests will skip"
  return 1
}

pa_image() {
  local image
  if command -v perf_analyzer >/dev/null 2>&1; then
    note "perf_analyzer on PATH: $(command -v perf_analyzer)"
    return 0
  fi
  image="$(PYTHON=.venv/bin/python scripts/perf-analyzer.sh --image)" || return
  note "perf_analyzer image: $image"
}

base_image() {
  local image
  image="$(scripts/container-base.sh)" || return
  note "container base image: $image"
}

# disk_room: the venv (torch, OpenVINO, TensorRT bindings), pytest's temporary files and the container images
# take about 8 GB; a full disk otherwise fails deep inside pip with ENOSPC (it did once, in CI).
disk_room() {
  local need_kb=$((8 * 1024 * 1024)) dir kb
  for dir in . "${TMPDIR:-/tmp}"; do
    kb=$(df -Pk "$dir" | awk 'NR==2 {print $4}')
    if [ "${kb:-0}" -lt "$need_kb" ]; then
      note "disk: $((kb / 1024)) MB free under $(cd "$dir" && pwd), the set-up and tests need about 8 GB;" \
        "free some (old clones, .venv copies, /tmp/pytest-of-$(id -un)) and run again"
      return 1
    fi
  done
}

start=$(usec)
step disk "" disk_room
step venv "" scripts/setup-venv.sh export,train,plugins,dev,cpu,ray
step browser browser scripts/install-browser.sh || true
step haproxy balancer scripts/install-haproxy.sh || true
if step "container engine" container scripts/container-setup.sh; then
  step "container base image" container base_image || true
  step "perf_analyzer image" perf_analyzer pa_image || true
elif ! without perf_analyzer; then
  note "perf_analyzer image: needs the container engine above (or perf_analyzer on PATH); opt out of its" \
    "tests with IRPE_TEST_WITHOUT=perf_analyzer"
  command -v perf_analyzer >/dev/null 2>&1 || setup_failed+=("perf_analyzer image")
fi
note "set-up $(since "$start")"
if [ "${#setup_failed[@]}" -gt 0 ] && strict; then
  note "stopping: set-up failed ($(IFS=,; echo "${setup_failed[*]}")); the lines above say what is missing," \
    "how to install it and how to opt out"
  exit 1
fi
step ruff "" .venv/bin/ruff check -q .

if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -m "not slow" "$@"
fi
# run PART PYTEST-ARGS...: one pytest process, timed, listing its 15 slowest tests; pytest's exit 5 (no tests
# collected) is a failure too.
failed=()
run() {
  local part=$1 t0 rc=0
  shift
  t0=$(usec)
  .venv/bin/python -m pytest -m "not slow" --durations=15 "$@" || rc=$?
  note "pytest $part: exit $rc after $(since "$t0")"
  [ "$rc" = 0 ] || failed+=("$part (exit $rc)")
}
run "all but tests/training" --ignore=tests/training
run tests/training tests/training
if [ "${#failed[@]}" -gt 0 ]; then
  note "FAILED: ${failed[*]}; total $(since "$start")"
  exit 1
fi
note "passed; total $(since "$start")"
