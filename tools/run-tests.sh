#!/usr/bin/env bash
# Sets up (packages, build) and runs the whole test suite through CTest. GUI tests run under
# tools/with-xvfb.sh; CUDA tests skip with a message where no device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
# The soak test (gui_soak, docs/testing.md) drives the app built with ASan + UBSan: only the
# kvscope target, in its own folder (KVSCOPE_SANITIZED_BUILD_DIR, default build-sanitized-app).
sanitized=${KVSCOPE_SANITIZED_BUILD_DIR:-build-sanitized-app}
tools/build-sanitized-app.sh "$sanitized"
export KVSCOPE_SANITIZED_APP="$PWD/$sanitized/app/kvscope"
cd "${KVSCOPE_BUILD_DIR:-build}"
# The CLI and the app keep exact references on disk (engine/eval/reference_cache.h): the suite uses a
# folder of its own, emptied first, so it never reads or fills the user's cache.
export KVSCOPE_CACHE_DIR="$PWD/test-cache"
rm -rf "$KVSCOPE_CACHE_DIR"
ctest --output-on-failure -j "$(nproc)" --timeout 900
