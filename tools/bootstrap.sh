#!/usr/bin/env bash
# Installs what the build needs (Debian 12 packages) when missing, then configures and builds
# KVScope in Release into ./build. Safe to run again: it only does what is left to do.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ pkg-config libglfw3-dev libimgui-dev libeigen3-dev nlohmann-json3-dev
  libstb-dev libcli11-dev libnanoflann-dev libgtest-dev libbenchmark-dev zlib1g-dev xvfb xauth fonts-dejavu-core
  xdotool x11-utils)
# A single-node Slurm for the cluster test (tests/slurm/test_slurm_set.sh starts its own daemons
# in a temporary folder); installed without recommends, and the packages' own services stay off
# where policy-rc.d says so (containers, CI).
SLURM_PACKAGES=(slurmctld slurmd slurm-client munge)
missing_of() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_of "${PACKAGES[@]}")
mapfile -t missing_slurm < <(missing_of "${SLURM_PACKAGES[@]}")
if ((${#missing[@]} + ${#missing_slurm[@]})); then
  echo "bootstrap: installing ${missing[*]} ${missing_slurm[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
  if ((${#missing_slurm[@]})); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      "${missing_slurm[@]}"
  fi
fi

BUILD_DIR=${KVSCOPE_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${KVSCOPE_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
