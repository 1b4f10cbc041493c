#!/usr/bin/env bash
# Sets up (packages, build) and runs the whole test suite through CTest. GUI tests run under
# xvfb-run; CUDA tests skip with a message where no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
cd "${KVSCOPE_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
