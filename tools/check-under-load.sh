#!/usr/bin/env bash
# The GUI tests on a busy machine (docs/testing.md, "Under load"): every core is kept busy by a
# busy loop while CTest runs the whole suite SUITES times, the real-input and GUI tests (label
# gui) RUNS times, then the GUI oracle walks on ORACLE_SEEDS fresh random seeds. The tests wait for what they need (the window
# viewable, the app answering), never for the machine to be idle, so they must pass here too.
#   tools/check-under-load.sh [runs (default 10)] [oracle seeds (default 20)] [steps per walk (default 40)]
#                             [whole suites (default 3)]
# KVSCOPE_BUILD_DIR picks the build folder (default build; built first). KVSCOPE_LOAD_TESTS, a
# CTest -R pattern, runs those tests instead of the label gui (e.g. gui_real_input|gui_oracle).
# gui_soak runs with the rest when KVSCOPE_SANITIZED_APP names the sanitized app (it skips
# otherwise). KVSCOPE_LOAD_NO_BUILD=1 skips the bootstrap build. Logs go to BUILD/under-load/.
# Exit status 0 when every run and every walk passed.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
seeds=${2:-20}
steps=${3:-40}
suites=${4:-3}
case "$runs$seeds$steps$suites" in *[!0-9]*)
  echo "usage: tools/check-under-load.sh [runs] [oracle seeds] [steps per walk] [whole suites]" \
    "(whole numbers)" >&2
  exit 2 ;;
esac
build=${KVSCOPE_BUILD_DIR:-build}
if [ -z "${KVSCOPE_LOAD_NO_BUILD:-}" ]; then
  tools/bootstrap.sh >/dev/null
fi
logs="$build/under-load"
rm -rf "$logs"
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

# The load: one busy loop per core, started before the tests and ended (by their ids) on exit.
load_pids=()
stop_load() {
  for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_load EXIT
for ((i = 0; i < $(nproc); ++i)); do
  (while :; do :; done) &
  load_pids+=($!)
done
echo "under-load: ${#load_pids[@]} busy loops on $(nproc) cores; logs in $logs"

# One CTest run of `what` (its log under $logs/NAME.log): prints whether it passed and the tests
# that failed (not those skipped); returns CTest's status.
ctest_run() {
  local name=$1 what=$2
  shift 2
  local log="$logs/$name.log"
  if (cd "$build" && ctest "$@" -j 2 --output-on-failure) >"$log" 2>&1; then
    echo "under-load: $what passed ($(grep -o '[0-9]*% tests passed.*' "$log" || true))"
  else
    echo "under-load: $what FAILED: $(grep -E '^\s+[0-9]+ - ' "$log" | grep -v '(Skipped)' |
      tr -s ' ' | tr '\n' ';') log $log"
    return 1
  fi
}

# The whole suite first (what CI runs), each run in its own turn: two CTest processes must never
# share a build folder (the GUI tests write into one output folder).
suites_passed=0
for ((r = 1; r <= suites; ++r)); do
  if ctest_run "ctest_suite_$r" "whole suite run $r" --timeout 1200; then
    suites_passed=$((suites_passed + 1))
  fi
done

if [ -n "${KVSCOPE_LOAD_TESTS:-}" ]; then
  select=(-R "$KVSCOPE_LOAD_TESTS")
else
  select=(-L gui)
fi
runs_passed=0
for ((r = 1; r <= runs; ++r)); do
  if ctest_run "ctest_run_$r" "GUI tests run $r" "${select[@]}" --timeout 900; then
    runs_passed=$((runs_passed + 1))
  fi
done

walks_passed=0
for ((w = 1; w <= seeds; ++w)); do
  # A fresh seed each time, printed so that a failing walk can be run again.
  seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  log="$logs/oracle_seed_$seed.log"
  if KVSCOPE_ORACLE_SEED=$seed KVSCOPE_ORACLE_STEPS=$steps \
    tools/with-xvfb.sh "$build/app/test_gui_oracle" >"$log" 2>&1; then
    walks_passed=$((walks_passed + 1))
    echo "under-load: oracle seed $seed passed ($steps steps)"
  else
    echo "under-load: oracle seed $seed FAILED: $(grep -m1 -A1 'Failure' "$log" | tail -1) log $log"
  fi
done

echo "under-load: whole suite $suites_passed of $suites runs passed; GUI tests $runs_passed of" \
  "$runs runs passed; oracle $walks_passed of $seeds fresh seeds passed ($steps steps each)"
((suites_passed == suites && runs_passed == runs && walks_passed == seeds))
