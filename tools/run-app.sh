#!/usr/bin/env bash
# Sets up (packages, build) and opens the KVScope app on the bundled sample capture.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/bootstrap.sh
exec build/app/kvscope "${@:-sample_data/stories260K_lily.safetensors}"
