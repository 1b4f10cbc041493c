#!/usr/bin/env bash
# Builds the app (the kvscope target only) with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DKVSCOPE_SANITIZE=ON) into its own folder, for the soak test (gui_soak, tools/soak.sh;
# docs/testing.md). -O1 with line tables: readable reports at a fraction of the compile time of
# -O2 -g; no CUDA (nvcc does not take the sanitizer flags), no tests or benchmarks.
#   tools/build-sanitized-app.sh [folder (default build-sanitized-app)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-sanitized-app}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DKVSCOPE_SANITIZE=ON -DKVSCOPE_BUILD_APP=ON \
    -DKVSCOPE_BUILD_TESTS=OFF -DKVSCOPE_BUILD_BENCH=OFF -DKVSCOPE_ENABLE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -DNDEBUG" \
    ${KVSCOPE_CMAKE_ARGS:-}
fi
cmake --build "$build" --target kvscope -j "$(nproc)"
