#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS (default 600) on a copy of its seed corpus
# (fuzz/corpus/<format>) with the JSON-header dictionary, and prints the run counts.
#   fuzz/run_fuzz.sh BUILD_DIR [SECONDS]
set -euo pipefail
build=${1:?usage: fuzz/run_fuzz.sh BUILD_DIR [SECONDS]}
seconds=${2:-600}
src=$(cd "$(dirname "$0")" && pwd)
for pair in fuzz_safetensors_header:safetensors fuzz_npz:npz; do
  target=${pair%%:*} corpus=${pair##*:}
  work=$(mktemp -d)
  cp "$src/corpus/$corpus"/* "$work/"
  cp "$src/../tests/malformed"/*."${corpus}" "$work/" 2>/dev/null || true
  # -rss_limit_mb: a reader that allocates past the limits would be reported as a finding.
  "$build/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 \
    -dict="$src/json_header.dict" -print_final_stats=1 "$work" 2>&1 |
    grep -E "stat::number_of_executed_units|stat::new_units_added|ERROR|SUMMARY|Done" || true
  rm -rf "$work"
done
