#!/usr/bin/env bash
# Installs what the build needs (Debian 12 packages) when missing, then configures and builds
# KVScope in Release into ./build. Safe to run again: it only does what is left to do.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake ninja-build g++ pkg-config libglfw3-dev libimgui-dev libeigen3-dev nlohmann-json3-dev
  libstb-dev libcli11-dev libnanoflann-dev libgtest-dev libbenchmark-dev zlib1g-dev xvfb xauth fonts-dejavu-core
  xdotool x11-utils)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

BUILD_DIR=${KVSCOPE_BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${KVSCOPE_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
