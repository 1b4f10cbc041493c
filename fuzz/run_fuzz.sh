#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS (default 600), one after another, on a copy of its seed
# corpus (fuzz/corpus/<format> plus the matching files of tests/malformed; the capture readers
# with the JSON-header dictionary, the eval-report and session readers with their own), and
# prints the run count, coverage and any finding.
#   fuzz/run_fuzz.sh BUILD_DIR [SECONDS] [TARGET...]
# Full logs and any crash/leak/timeout reproducer are kept in $FUZZ_LOG_DIR (default
# BUILD_DIR/fuzz-logs); a reproducer belongs in tests/malformed once the bug is fixed.
set -euo pipefail
build=${1:?usage: fuzz/run_fuzz.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-600}
shift $(($# < 2 ? $# : 2))
src=$(cd "$(dirname "$0")" && pwd)
logs=${FUZZ_LOG_DIR:-$build/fuzz-logs}
mkdir -p "$logs"
declare -A corpus_of=([fuzz_safetensors_header]=safetensors [fuzz_npz]=npz [fuzz_llama2c]=llama2c
  [fuzz_eval_report]=eval_report [fuzz_session]=session)
declare -A dict_of=([safetensors]=json_header.dict [npz]=json_header.dict
  [eval_report]=eval_report.dict [session]=session.dict)
targets=("$@")
((${#targets[@]})) ||
  targets=(fuzz_safetensors_header fuzz_npz fuzz_llama2c fuzz_eval_report fuzz_session)
status=0
for target in "${targets[@]}"; do
  [ -x "$build/fuzz/$target" ] || { echo "$target: not built, skipped"; continue; }
  corpus=${corpus_of[$target]}
  work=$(mktemp -d)
  cp "$src/corpus/$corpus"/* "$work/"
  cp "$src/../tests/malformed"/*."${corpus}" "$work/" 2>/dev/null || true
  seeds=$(ls "$work" | wc -l)
  dict=()
  [ -z "${dict_of[$corpus]:-}" ] || dict=(-dict="$src/${dict_of[$corpus]}")
  # -rss_limit_mb: a reader that allocates past the limits would be reported as a finding.
  rc=0
  "$build/fuzz/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 \
    "${dict[@]}" -artifact_prefix="$logs/$target-" -print_final_stats=1 \
    "$work" >"$logs/$target.log" 2>&1 || rc=$?
  echo "$target: $seeds seeds, exit $rc"
  grep -E "DONE|stat::number_of_executed_units|stat::average_exec_per_sec|stat::new_units_added|stat::peak_rss_mb|ERROR|SUMMARY|Done" \
    "$logs/$target.log" || true
  ((rc == 0)) || status=1
  rm -rf "$work"
done
exit $status
