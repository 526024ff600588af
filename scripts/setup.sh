#!/usr/bin/env bash
# Installs every system dependency of DSKernels from Debian 12 packages.
# Idempotent: runs `apt-get update` at most once and installs only what is missing. Quiet on success.
set -euo pipefail

packages=(
  build-essential g++ clang ninja-build cmake git pkg-config ccache
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libdlpack-dev libxxhash-dev
  libopenmpi-dev openmpi-bin
  libdnnl-dev ocl-icd-opencl-dev  # dnnl-config.cmake requires OpenCL (only Recommended by the package)
  gnuplot-nox
  clang-format
  python3  # tests/core/clang_syntax.py
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup.sh: failed to install: ${missing[*]}" >&2
  exit 1
fi
