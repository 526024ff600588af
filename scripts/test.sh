#!/usr/bin/env bash
# The whole test suite, as README.md and CI run it: a release build and every CTest test, then
# the same suite under AddressSanitizer + UndefinedBehaviorSanitizer (without the tests labelled
# "slow"). Usage: scripts/test.sh [release|sanitize|all] (default all).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
jobs=$(nproc)

run_preset() {
  local preset=$1
  shift
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  ctest --preset "$preset" -j "$jobs" "$@"
}

case "$what" in
  release) run_preset release ;;
  sanitize) run_preset sanitize -LE slow ;;
  all)
    run_preset release
    run_preset sanitize -LE slow
    ;;
  *)
    echo "usage: scripts/test.sh [release|sanitize|all]" >&2
    exit 2
    ;;
esac
