#!/usr/bin/env bash
# The device check (docs/performance.md, "Device check"), sized for one call of a lent GPU (under 8 minutes, every step
# under its own time limit so one hang cannot eat the lease). Build here with CUDA, pack, then run
# this one command on the device:
#
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_NATIVE=OFF
#   cmake --build build-gpu --target test_cuda_parity test_cuda_resident bench_gpu kvscope-cli \
#         bench_app_grid
#   tools/gpu_pack.sh build-gpu                      # -> .carry/bundle.tgz
#   device: tools/gpu_device_check.sh .carry/bundle.tgz        (carry: .carry)
#
# Steps (results in $OUT, or $GPU_REPORT, as summary.txt and report.tgz):
#   1. at once, side by side: every CUDA parity test (test_cuda_parity in 4 shards, every golden
#      case) and the resident-layer tests (test_cuda_resident); compute-sanitizer memcheck,
#      racecheck, initcheck and synccheck on the op tests; tests/capture_hf_test.py (tiny Hugging
#      Face models captured on the CPU and the GPU); the CPU side of the evals below (a 4-layer 8192-token synthetic
#      capture is written there: 400 MB do not travel);
#   2. eval --backend cuda on the three samples and the synthetic capture, compared with the CPU's
#      JSON: every integer equal (kept counts, budgets), every float within 1e-9 relative or
#      1e-12 absolute (the per-query errors too, so a different selection shows as a mismatch);
#   3. the app's grid headless on the synthetic capture (bench_app_grid --backend cuda, then cpu):
#      first whole grid, a gamma change, a ratio change;
#   4. bench_gpu (every BM_Gpu* beside its BM_Cpu*), then bench/torch_walk.py (the 20x target).
# With CHECK_DRY=1 it runs on a machine without a GPU (the device steps then report their skip):
# how the script itself is tried before a lease (every device step then fails, saying why).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUNDLE=${1:-.carry/bundle.tgz}
B=build-gpu
REPORT=${GPU_REPORT:-${OUT:-/tmp/gpu-report}}
WORK=$(mktemp -d)
mkdir -p "$REPORT/r"
R="$REPORT/r"
SUMMARY="$REPORT/summary.txt"
: >"$SUMMARY"
T0=$(date +%s)
say() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$SUMMARY"; }
# Every step's limit is cut to what is left of the whole check's budget, so the report always
# comes back inside the device call.
BUDGET=${CHECK_BUDGET_S:-520}
lim() {
  local left=$((BUDGET - ($(date +%s) - T0)))
  ((left < 5)) && left=5
  echo $(($1 < left ? $1 : left))
}
failures=0
fail() {
  say "FAILED: $*"
  failures=$((failures + 1))
}
finish() {
  find "$R" -type f -name "*.log" -size +4M -exec truncate -s 4M {} \;
  tar -C "$REPORT" -czf "$REPORT/report.tgz" r 2>/dev/null && rm -rf "$R"
  say "device check: $failures step(s) failed"
  exit $((failures > 0))
}

if [ "${CHECK_DRY:-0}" != 1 ]; then
  tar -xzf "$BUNDLE" -C "$ROOT" || {
    say "cannot unpack $BUNDLE"
    exit 1
  }
fi
# The test binaries name the build machine's source folder (and its ../shared): link it here.
BUILT_ROOT=$(sed -n 's/^# Source directory: //p' $B/CTestTestfile.cmake | head -1)
if [ -n "$BUILT_ROOT" ] && [ "$BUILT_ROOT" != "$ROOT" ] && [ ! -e "$BUILT_ROOT" ]; then
  mkdir -p "$(dirname "$BUILT_ROOT")" && ln -s "$ROOT" "$BUILT_ROOT"
fi
[ -e "$(dirname "$ROOT")/shared" ] || ln -s "$ROOT/shared" "$(dirname "$ROOT")/shared"
export LD_LIBRARY_PATH="$ROOT/$B/carried-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVSCOPE_SOURCE_DIR="$ROOT"
CLI=$B/kvscope-cli

{
  date -u
  git -C "$ROOT" log -1 --format='commit %H %s' 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  lscpu | grep -E "Model name|^CPU\(s\)"
} | tee "$R/machine.txt" | tee -a "$SUMMARY"
for b in $B/tests/test_cuda_parity $B/tests/test_cuda_resident $B/bench/bench_gpu $CLI $B/bench/bench_app_grid; do
  [ -x "$b" ] || fail "$b missing from the bundle"
  ldd "$b" 2>/dev/null | grep -q "not found" && fail "$b: $(ldd "$b" | grep "not found" | tr -s ' \t' ' ')"
done

# ---- 1. tests, sanitizers and the CPU evals side by side
say "1. parity tests (4 shards + resident), compute-sanitizer (4 tools), the HF capture test, CPU evals"
OPS='Ops/OpParity.*:CudaParity.*BadBatches*:CudaParity.*Reject*:CudaParity.AttentionErrorOfFullSelectionIsZero'
pids=()
for i in 0 1 2 3; do
  GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i KVSCOPE_GOLDEN_STRIDE=1 timeout $(lim 200) \
    $B/tests/test_cuda_parity >"$R/parity_$i.log" 2>&1 &
  pids+=($!)
done
timeout $(lim 200) $B/tests/test_cuda_resident >"$R/resident.log" 2>&1 &
pids+=($!)
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck initcheck synccheck; do
  timeout $(lim 200) "$SAN" --tool $tool --error-exitcode 3 $B/tests/test_cuda_parity --gtest_filter="$OPS" \
    >"$R/sanitizer_$tool.log" 2>&1 &
  pids+=($!)
done
SAMPLES="sample_data/stories260K_lily.safetensors sample_data/stories260K_dragon.safetensors sample_data/kjv3M_beginning.safetensors"
SYNTH=$WORK/synth_4x8k.safetensors
# The eval reports: the samples' come back in the report, the synthetic capture's (tens of MB)
# stay on the device.
json_of() { if [ "$1" = synth_4x8k ]; then echo "$WORK/eval_$1_$2.json"; else echo "$R/eval_$1_$2.json"; fi; }
(
  for cap in $SAMPLES; do
    timeout $(lim 120) $CLI eval "$cap" --methods all --ratios 0.5,0.25,0.125 --seeds 3 --backend cpu --threads 8 \
      --json "$(json_of "$(basename "$cap" .safetensors)" cpu)" >/dev/null 2>"$R/eval_$(basename "$cap" .safetensors)_cpu.err"
  done
  timeout $(lim 60) $CLI synth --tokens ${CHECK_SYNTH_TOKENS:-8192} --layers 4 --out "$SYNTH" --quiet &&
    timeout $(lim 200) $CLI eval "$SYNTH" --methods all --ratios 0.25 --seeds 1 --backend cpu --threads 8 \
      --json "$(json_of synth_4x8k cpu)" >/dev/null 2>"$R/eval_synth_4x8k_cpu.err"
) &
cpu_evals=$!
# The Hugging Face capture tool on the device's torch and transformers: tiny Llama and Qwen2 on
# the CPU and the GPU, q/k/v and W_O against the models' own outputs.
timeout $(lim 200) python3 tests/capture_hf_test.py --cli "$CLI" >"$R/capture_hf.log" 2>&1 &
pids+=($!)
names=(parity_0 parity_1 parity_2 parity_3 resident sanitizer_memcheck sanitizer_racecheck
  sanitizer_initcheck sanitizer_synccheck capture_hf)
for k in "${!pids[@]}"; do
  wait "${pids[$k]}"
  rc=$?
  log="$R/${names[$k]}.log"
  summary=$(grep -E "^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|ERROR SUMMARY|RACECHECK SUMMARY|golden cases on the device|^model test|^FAIL" "$log" | tr -s ' \n' ' ')
  if [ $rc -eq 0 ]; then say "${names[$k]}: ok: $summary"; else fail "${names[$k]} (exit $rc, 124 = its time limit): $summary"; fi
  grep -E "^\[  FAILED  \] [A-Za-z]" "$log" | sort -u | tee -a "$SUMMARY"
  # On a device every test must run: a skip there means the device was not usable.
  if grep -qE "^\[  SKIPPED \] [A-Za-z]" "$log"; then
    [ "${CHECK_DRY:-0}" = 1 ] || fail "${names[$k]}: tests skipped on the device"
    grep -A1 -m1 ": Skipped" "$log" | tail -1 | tee -a "$SUMMARY"
  fi
done
wait $cpu_evals

# ---- 2. eval on the device against the CPU
say "2. eval --backend cuda against the CPU's JSON (1e-9 relative, integers equal)"
for cap in $SAMPLES $SYNTH; do
  name=$(basename "$cap" .safetensors)
  [ "$cap" = "$SYNTH" ] && args=(--ratios 0.25 --seeds 1) || args=(--ratios 0.5,0.25,0.125 --seeds 3)
  if [ ! -s "$(json_of "$name" cpu)" ]; then
    fail "eval $name --backend cpu: $(tail -2 "$R/eval_${name}_cpu.err" 2>/dev/null)"
    continue
  fi
  start=$(date +%s.%N)
  timeout $(lim 120) $CLI eval "$cap" --methods all "${args[@]}" --backend cuda --threads 8 \
    --json "$(json_of "$name" cuda)" >/dev/null 2>"$R/eval_${name}_cuda.err" ||
    fail "eval $name --backend cuda: $(tail -2 "$R/eval_${name}_cuda.err")"
  say "eval $name --backend cuda: $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}') s"
  [ -s "$(json_of "$name" cuda)" ] || continue
  python3 - "$(json_of "$name" cpu)" "$(json_of "$name" cuda)" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
SKIP = ("backend", "elapsed_s", "seconds", "timing", "command", "path")
worst, where, floats, ints, bad = 0.0, "", 0, 0, []
def walk(x, y, path):
    global worst, where, floats, ints
    if isinstance(x, dict):
        if not isinstance(y, dict):
            bad.append(path + ": missing"); return
        for k in x:
            if k not in SKIP:
                walk(x[k], y.get(k), path + "." + k)
    elif isinstance(x, list):
        if not isinstance(y, list) or len(y) != len(x):
            bad.append(path + ": lengths differ"); return
        for i, v in enumerate(x):
            walk(v, y[i], "%s[%d]" % (path, i))
    elif isinstance(x, bool) or isinstance(x, int) or isinstance(x, str):
        ints += 1
        if x != y: bad.append("%s: %r vs %r" % (path, x, y))
    elif isinstance(x, float):
        floats += 1
        if not isinstance(y, (int, float)):
            bad.append(path + ": not a number"); return
        # Figures that are rounding noise around zero (the exact method's errors: 1e-14 on the
        # CPU at 8192 tokens, 0 on the device) are compared absolutely.
        rel = abs(x - y) / max(abs(x), abs(y), 1e-300)
        if abs(x - y) > 1e-12 and rel > worst:
            worst, where = rel, path
walk(a, b, "")
ok = not bad and worst <= 1e-9 and floats > 0
print("  %s: %d floats, worst relative %.3g%s; %d integers/strings, %d differ%s" % (
    sys.argv[1].rsplit("/", 1)[-1].replace("_cpu.json", ""), floats, worst,
    (" at " + where) if where else "", ints, len(bad), ("; first: " + "; ".join(bad[:3])) if bad else ""))
sys.exit(0 if ok else 1)
PY
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "eval $name: cuda differs from cpu"
done

# ---- 3. the app's grid on the device
say "3. the app's grid headless on the 4 x 8192 capture (bench_app_grid)"
for be in cuda cpu; do
  timeout $(lim 100) $B/bench/bench_app_grid "$SYNTH" --backend $be >"$R/app_grid_$be.txt" 2>&1 ||
    fail "bench_app_grid --backend $be (exit $?)"
  sed 's/^/  /' "$R/app_grid_$be.txt" | tee -a "$SUMMARY"
done

# ---- 4. benchmarks
say "4. bench_gpu and the torch walk"
# The device's benchmarks three times (medians), the CPU's peers once (seconds each at 8k-32k).
timeout $(lim 120) $B/bench/bench_gpu --benchmark_filter=BM_Gpu --benchmark_min_time=0.2 \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$R/bench_gpu.json" --benchmark_out_format=json >"$R/bench_gpu.txt" 2>&1 ||
  fail "bench_gpu BM_Gpu (exit $?)"
timeout $(lim 90) $B/bench/bench_gpu --benchmark_filter=BM_Cpu --benchmark_min_time=0.01 \
  --benchmark_out="$R/bench_cpu.json" --benchmark_out_format=json >"$R/bench_cpu.txt" 2>&1 ||
  fail "bench_gpu BM_Cpu (exit $?)"
cat "$R/bench_gpu.txt" "$R/bench_cpu.txt" | grep -E "_median|^BM_Cpu|ERROR" | awk '!seen[$1]++' |
  cut -c1-160 | tee -a "$SUMMARY"
timeout $(lim 60) python3 bench/torch_walk.py >"$R/torch_walk.json" 2>"$R/torch_walk.err" ||
  say "torch walk not measured: $(tail -2 "$R/torch_walk.err")"
say "torch walk: $(cat "$R/torch_walk.json")"
# ---- 5. the grid at full size and the kernels' profiles, while the budget lasts
say "5. the app's grid on a 32 x 8192 capture (the 0.3 s target of a parameter change)"
FULL=$WORK/synth_32x8k.safetensors
rm -f "$SYNTH"
if timeout $(lim 90) $CLI synth --tokens 8192 --out "$FULL" --quiet; then
  timeout $(lim 120) $B/bench/bench_app_grid "$FULL" --backend cuda >"$R/app_grid_32x8k_cuda.txt" 2>&1 ||
    fail "bench_app_grid 32 x 8192 --backend cuda (exit $?)"
  sed 's/^/  /' "$R/app_grid_32x8k_cuda.txt" | tee -a "$SUMMARY"
else
  say "the 32 x 8192 capture was not written in time"
fi
rm -f "$FULL"
say "6. Nsight Compute on the walk and the attention errors (the 2 ms and 1 ms targets)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "$(lim 60)" -ge 30 ]; then
  timeout $(lim 90) "$NCU" --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --launch-count 12 \
    $B/bench/bench_gpu --benchmark_filter='BM_GpuWalkTwoRounds/layer_32x32k/f32|BM_GpuErrors/layer_8k/double' \
    --benchmark_min_time=0.001 --benchmark_repetitions=1 >"$R/ncu.txt" 2>&1 || say "ncu: exit $?"
  grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Size|Grid Size" \
    "$R/ncu.txt" | head -60 | tee -a "$SUMMARY"
else
  say "ncu not run (not found, or no time left)"
fi
rm -rf "$WORK"
finish
