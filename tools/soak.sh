#!/usr/bin/env bash
# The sanitizer soak for people (docs/testing.md): the app built with ASan +
# UBSan, its real window under Xvfb driven by a seeded random stream of real input for MINUTES
# (tests/gui/test_gui_soak.cpp), then a report: events, sanitizer findings, the resident-memory
# curve, frame-time median and 99th percentile, the oracle's comparisons with kvscope-cli eval,
# the malformed files and their errors. CI runs the same test for 60 s (ctest -R gui_soak).
#   tools/soak.sh [minutes (default 10)] [seed (default 1)]
# The report goes to $KVSCOPE_SOAK_REPORT (default BUILD/soak-report-seed<seed>/): soak_report.json,
# soak_report.txt and soak.log. KVSCOPE_SANITIZED_BUILD_DIR picks the sanitized build folder
# (default build-sanitized-app), KVSCOPE_BUILD_DIR the Release one that holds the driver and
# kvscope-cli (default build). Exit status 0 when every criterion passed.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
seed=${2:-1}
case "$minutes$seed" in *[!0-9]*)
  echo "usage: tools/soak.sh [minutes] [seed] (whole numbers)" >&2
  exit 2 ;;
esac
build=${KVSCOPE_BUILD_DIR:-build}
sanitized=${KVSCOPE_SANITIZED_BUILD_DIR:-build-sanitized-app}
if [ -z "${KVSCOPE_SOAK_NO_BUILD:-}" ]; then
  tools/bootstrap.sh >/dev/null
  tools/build-sanitized-app.sh "$sanitized"
  cmake --build "$build" --target test_gui_soak kvscope-cli
fi
report=${KVSCOPE_SOAK_REPORT:-$build/soak-report-seed$seed}
mkdir -p "$report"
report=$(cd "$report" && pwd)
echo "soak: $minutes min, seed $seed, app $sanitized/app/kvscope; report in $report"
rc=0
KVSCOPE_SANITIZED_APP="$PWD/$sanitized/app/kvscope" KVSCOPE_SOAK_SECONDS=$((minutes * 60)) \
  KVSCOPE_SOAK_SEED=$seed KVSCOPE_SOAK_REPORT="$report" \
  tools/with-xvfb.sh "$build/app/test_gui_soak" >"$report/soak.log" 2>&1 || rc=$?
if [ -f "$report/soak_report.txt" ]; then
  cat "$report/soak_report.txt"
else
  tail -40 "$report/soak.log"
fi
echo "soak: log in $report/soak.log"
exit $rc
