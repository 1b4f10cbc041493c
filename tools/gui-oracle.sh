#!/usr/bin/env bash
# The GUI numbers oracle for people: the real app under Xvfb, driven by seeded random
# real-input walks (tests/gui/test_gui_oracle.cpp), every exported number checked against
# kvscope-cli eval after every step. CI runs one short walk; this runs longer walks, one seed
# after another, until the time is up.
#   tools/gui-oracle.sh [minutes (default 10)] [steps per walk (default 40)] [first seed (default 100)]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
steps=${2:-40}
seed=${3:-100}
case "$minutes$steps$seed" in *[!0-9]*)
  echo "usage: tools/gui-oracle.sh [minutes] [steps per walk] [first seed] (whole numbers)" >&2
  exit 2 ;;
esac
tools/bootstrap.sh >/dev/null
build=${KVSCOPE_BUILD_DIR:-build}
mkdir -p "$build/gui_test_out"
end=$((SECONDS + minutes * 60))
walks=0 failed=0
while ((SECONDS < end)); do
  echo "gui-oracle: walk with seed $seed, $steps steps"
  if KVSCOPE_ORACLE_SEED=$seed KVSCOPE_ORACLE_STEPS=$steps \
    tools/with-xvfb.sh "$build/app/test_gui_oracle" \
    >"$build/gui_test_out/oracle_seed_$seed.log" 2>&1; then
    echo "gui-oracle: seed $seed passed ($(grep -o '[0-9]* eval runs compared' \
      "$build/gui_test_out/oracle_seed_$seed.log"))"
  else
    failed=$((failed + 1))
    echo "gui-oracle: seed $seed FAILED: $build/gui_test_out/oracle_seed_$seed.log"
  fi
  walks=$((walks + 1)) seed=$((seed + 1))
done
echo "gui-oracle: $walks walks, $failed failed"
((failed == 0))
