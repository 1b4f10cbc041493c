#!/usr/bin/env bash
# Runs on the GPU machine, in a copy of the repository, with the bundle of tools/gpu_pack.sh:
# unpacks it, makes the paths the CTest files were written with point here, then runs
#   1. tools/gpu_check.sh on the prebuilt binaries (device parity incl. every golden case,
#      eval --backend cuda against the CPU, the Hugging Face capture test, benchmarks, torch walk,
#      compute-sanitizer), and
#   2. the whole CTest suite on this machine's CPU (with the device present).
# Results go to $GPU_REPORT (default /tmp/gpu-report); the caller archives them.
# A second argument `cpu-walk` runs only the CPU walk timings (no GPU work, no CTest).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUNDLE=${1:-.carry/bundle.tgz}
ONLY=${2:-}
REPORT=${GPU_REPORT:-/tmp/gpu-report}
mkdir -p "$REPORT"
tar -xzf "$BUNDLE" -C "$ROOT" || { echo "cannot unpack $BUNDLE"; exit 1; }
# The CTest files and test binaries name the source folder of the build machine (and its
# ../shared): link that path here.
BUILT_ROOT=$(sed -n 's/^# Source directory: //p' build-gpu/CTestTestfile.cmake | head -1)
if [ -n "$BUILT_ROOT" ] && [ "$BUILT_ROOT" != "$ROOT" ] && [ ! -e "$BUILT_ROOT" ]; then
  mkdir -p "$(dirname "$BUILT_ROOT")" && ln -s "$ROOT" "$BUILT_ROOT"
fi
[ -e "$(dirname "$ROOT")/shared" ] || ln -s "$ROOT/shared" "$(dirname "$ROOT")/shared"
export LD_LIBRARY_PATH="$ROOT/build-gpu/carried-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The CTest files name the build machine's Python (/usr/bin/python3).
PY_BUILT=$(grep -ho '/[^" ]*/python3[.0-9]*' build-gpu/tests/CTestTestfile.cmake | head -1)
if [ -n "$PY_BUILT" ] && [ ! -x "$PY_BUILT" ]; then mkdir -p "$(dirname "$PY_BUILT")" && ln -s "$(command -v python3)" "$PY_BUILT"; fi
echo "source folder of the build: $BUILT_ROOT, here: $ROOT" | tee "$REPORT/paths.txt"
{
  nvidia-smi
  lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512[a-z_]*\).*/Flags: ... avx512 present .../'
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$REPORT/machine.txt" 2>&1
cat "$REPORT/machine.txt"

check=0
if [ "$ONLY" != cpu-walk ]; then
  GPU_CHECK_OUT="$REPORT" KVSCOPE_GPU_PREBUILT=1 tools/gpu_check.sh build-gpu
  check=$?
fi

# The CPU walk on this host (docs/performance.md's target machine is an AVX-512 Xeon, which the development
# VM is not): the walk Gram of each SIMD table alone, and the whole walk with the AVX2 table
# forced and with the widest one, alternated, one core each.
echo "== CPU walk on this host"
{
  lscpu | grep -E "Model name|^CPU\(s\)"
  for simd in avx2 default; do
    echo "bench_walk, KVSCOPE_SIMD=$simd"
    if [ "$simd" = default ]; then unset KVSCOPE_SIMD; else export KVSCOPE_SIMD=$simd; fi
    taskset -c 2 build-gpu/bench/bench_walk --benchmark_filter='WalkGramF32|WalkOpOneBlockInCache|WalkOpOneRound' \
      --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
  done
  unset KVSCOPE_SIMD
  # The whole walk, one line per run: this build with the AVX2 table forced and with the widest
  # table, and (when the bundle carries one, tools/gpu_pack.sh BEFORE=...) an earlier build,
  # alternated so drifts of this host's speed hit all alike.
  walk() {  # label, binary, KVSCOPE_SIMD or "default"
    local out
    if [ "$3" = default ]; then
      out=$(env -u KVSCOPE_SIMD taskset -c 2 "$2" bench --backend cpu --n 8192 --heads 1 --rounds 2 --repeat 40)
    else
      out=$(KVSCOPE_SIMD=$3 taskset -c 2 "$2" bench --backend cpu --n 8192 --heads 1 --rounds 2 --repeat 40)
    fi
    echo "walk $1: $(echo "$out" | sed -n 3p)"
  }
  for i in 1 2 3 4 5 6; do
    walk "avx2, run $i" build-gpu/kvscope-cli avx2
    walk "default, run $i" build-gpu/kvscope-cli default
    [ -x build-gpu/kvscope-cli.before ] && walk "before (default), run $i" build-gpu/kvscope-cli.before default
  done
  for block in 512; do
    for simd in avx2 default; do
      echo "walk --block $block, KVSCOPE_SIMD=$simd"
      if [ "$simd" = default ]; then unset KVSCOPE_SIMD; else export KVSCOPE_SIMD=$simd; fi
      taskset -c 2 build-gpu/kvscope-cli bench --backend cpu --n 8192 --heads 1 --rounds 2 \
        --block $block --repeat 10 | sed -n 3p
    done
  done
  unset KVSCOPE_SIMD
  KVSCOPE_CLI=build-gpu/kvscope-cli PYTHON=$(command -v python3) bench/peers.sh --only walk --reps 5 \
    2>&1 | tail -16
} >"$REPORT/cpu_walk.txt" 2>&1
cat "$REPORT/cpu_walk.txt"
[ "$ONLY" = cpu-walk ] && exit 0

echo "== CTest suite on this machine"
(cd build-gpu && ctest -j 12 --timeout 600 --output-on-failure) >"$REPORT/ctest_all.log" 2>&1
suite=$?
grep -E "tests passed|tests failed|\*\*\*|Failed|Not Run" "$REPORT/ctest_all.log" | tail -30
echo "gpu_check exit $check, ctest exit $suite"
exit $((check | suite))
