#!/usr/bin/env bash
# One-shot check of the CUDA backend on a machine with an NVIDIA GPU (written for an H100):
#   1. configure + build (Release, CUDA on) the parity test, the GPU benchmarks and the CLI
#   2. run the CUDA tests through CTest (they must RUN, not skip, when a device is present)
#   3. compute-sanitizer memcheck, racecheck, initcheck and synccheck on the parity test
#   4. bench/bench_gpu (Google Benchmark, JSON) and bench/torch_walk.py (PyTorch baseline)
#   5. write a markdown table (GPU time, CPU time, ratios, the targets of docs/performance.md) and print it
# Usage: tools/gpu_check.sh [build-dir]      (default: build-gpu; results in <build-dir>/gpu-report,
#        or in $OUT when set). Exit status is non-zero when a step fails; later steps still run.
#        KVSCOPE_GPU_PREBUILT=1 skips configure/build and runs the binaries already in build-dir
#        directly (for a device machine without the build dependencies: build with CUDA
#        elsewhere, carry build-dir over; the tests then run without CTest).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build-gpu}
REPORT=${GPU_CHECK_OUT:-${OUT:-$BUILD/gpu-report}}
mkdir -p "$REPORT"
LOG="$REPORT/gpu_check.log"
: >"$LOG"
status=0
step() { echo "== $*" | tee -a "$LOG"; }
fail() {
  echo "FAILED: $*" | tee -a "$LOG"
  status=1
}

step "device"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 >"$REPORT/device.txt"
else
  echo "nvidia-smi not found" | tee -a "$LOG"
fi

PREBUILT=${KVSCOPE_GPU_PREBUILT:-0}
if [ "$PREBUILT" = 1 ]; then
  step "prebuilt binaries in $BUILD"
  for b in "$BUILD/tests/test_cuda_parity" "$BUILD/bench/bench_gpu"; do
    [ -x "$b" ] || { fail "$b missing"; exit 1; }
    if ldd "$b" | grep -q "not found"; then
      fail "$b: shared libraries missing on this machine:"
      ldd "$b" | grep "not found" | tee -a "$LOG"
    fi
  done
else
  step "configure + build (Release, CUDA)"
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
  if ! cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_ENABLE_CUDA=ON \
    -DKVSCOPE_BUILD_APP=OFF -DCMAKE_CUDA_COMPILER="$NVCC" >>"$LOG" 2>&1; then
    fail "cmake configure (see $LOG)"
    tail -30 "$LOG"
    exit 1
  fi
  grep -q "KVScope CUDA kernels: ON" "$BUILD/CMakeCache.txt" "$LOG" 2>/dev/null ||
    echo "warning: configure did not report CUDA kernels ON" | tee -a "$LOG"
  if ! cmake --build "$BUILD" -j "$(nproc)" --target test_cuda_parity bench_gpu kvscope-cli \
    >>"$LOG" 2>&1; then
    fail "build (see $LOG)"
    tail -40 "$LOG"
    exit 1
  fi
fi

TEST_LOG="$REPORT/ctest_cuda.log"
if [ "$PREBUILT" = 1 ]; then
  step "CUDA tests (test_cuda_parity, prebuilt, every golden case)"
  (cd "$ROOT" && KVSCOPE_SOURCE_DIR="$ROOT" KVSCOPE_GOLDEN_STRIDE=1 "$BUILD/tests/test_cuda_parity") \
    >"$TEST_LOG" 2>&1 || fail "CUDA tests"
  grep -E "golden cases on the device|^\[  (FAILED|PASSED|SKIPPED)" "$TEST_LOG" | tee -a "$LOG"
else
  step "CUDA tests (ctest -R Cuda)"
  (cd "$BUILD" && ctest -R 'Cuda|cuda' --output-on-failure -V) >"$TEST_LOG" 2>&1 || fail "CUDA tests"
fi
grep -E "tests passed|tests failed|Skipped|no CUDA device" "$TEST_LOG" | sort | uniq -c | tee -a "$LOG"
if grep -q "no CUDA device" "$TEST_LOG"; then
  fail "CUDA tests skipped: the device was not usable (see $TEST_LOG)"
fi

step "eval --backend cuda against the CPU (every method, sample captures)"
CLI="$BUILD/kvscope-cli"
for cap in sample_data/stories260K_lily.safetensors sample_data/kjv3M_beginning.safetensors; do
  name=$(basename "$cap" .safetensors)
  for be in cpu cuda; do
    "$CLI" eval "$cap" --methods all --ratios 0.5,0.25,0.125 --seeds 3 --backend "$be" \
      --json "$REPORT/eval_${name}_$be.json" >"$REPORT/eval_${name}_$be.txt" 2>&1 ||
      fail "eval $name --backend $be (see $REPORT/eval_${name}_$be.txt)"
  done
  python3 - "$REPORT/eval_${name}_cpu.json" "$REPORT/eval_${name}_cuda.json" <<'PY' 2>&1 | tee -a "$LOG" ||
import json, math, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
worst, where, count = 0.0, "", 0
def walk(x, y, path):
    global worst, where, count
    if isinstance(x, dict):
        for k in x:
            if k in ("backend", "elapsed_s", "seconds", "timing", "command"):
                continue
            walk(x[k], y.get(k) if isinstance(y, dict) else None, path + "." + k)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            walk(v, y[i] if isinstance(y, list) and i < len(y) else None, "%s[%d]" % (path, i))
    elif isinstance(x, float) and isinstance(y, (int, float)):
        count += 1
        rel = abs(x - y) / max(abs(x), 1e-12)
        if rel > worst and abs(x - y) > 1e-12:
            worst, where = rel, path
walk(a, b, "")
print("%s: %d figures, worst relative difference cuda vs cpu %.3g at %s" % (sys.argv[1], count, worst, where))
sys.exit(0 if worst <= 1e-6 and count > 0 else 1)
PY
    fail "eval $name: cuda differs from cpu by more than 1e-6 relative"
done

step "Hugging Face capture (tests/capture_hf_test.py: tiny Llama and Qwen2, CPU and GPU)"
python3 tests/capture_hf_test.py --cli "$CLI" >"$REPORT/capture_hf.log" 2>&1
rc=$?
tail -8 "$REPORT/capture_hf.log" | tee -a "$LOG"
[ $rc -eq 0 ] || fail "capture_hf_test.py (exit $rc)"

step "compute-sanitizer"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SAN" ]; then
  for tool in memcheck racecheck initcheck synccheck; do
    if KVSCOPE_SOURCE_DIR="$ROOT" "$SAN" --tool "$tool" --error-exitcode 3 "$BUILD/tests/test_cuda_parity" \
      >"$REPORT/sanitizer_$tool.log" 2>&1; then
      echo "$tool: clean" | tee -a "$LOG"
    else
      fail "compute-sanitizer $tool (see $REPORT/sanitizer_$tool.log)"
      tail -20 "$REPORT/sanitizer_$tool.log"
    fi
  done
else
  fail "compute-sanitizer not found (install the CUDA toolkit's sanitizer)"
fi

step "bench_gpu"
"$BUILD/bench/bench_gpu" --benchmark_out="$REPORT/bench_gpu.json" \
  --benchmark_out_format=json --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  >"$REPORT/bench_gpu.txt" 2>&1 || fail "bench_gpu"
tail -25 "$REPORT/bench_gpu.txt"

step "torch_walk.py"
python3 bench/torch_walk.py >"$REPORT/torch_walk.json" 2>"$REPORT/torch_walk.err" ||
  echo "torch baseline not measured: $(cat "$REPORT/torch_walk.json" "$REPORT/torch_walk.err" | tail -3)" |
  tee -a "$LOG"

step "report"
python3 - "$REPORT" <<'PY' | tee "$REPORT/gpu_report.md"
import json, os, sys
rep = sys.argv[1]
bench = {}
device = "?"
try:
    data = json.load(open(os.path.join(rep, "bench_gpu.json")))
    for b in data.get("benchmarks", []):
        name = b["name"]
        if b.get("aggregate_name") not in (None, "median"):
            continue
        name = name.replace("_median", "").replace("/manual_time", "")
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        bench[name] = None if b.get("error_occurred") else b["real_time"] * unit
except (OSError, ValueError) as e:
    print(f"(no benchmark JSON: {e})")
try:
    device = open(os.path.join(rep, "device.txt")).read().strip() or device
except OSError:
    pass
try:
    torch = json.load(open(os.path.join(rep, "torch_walk.json")))
except (OSError, ValueError):
    torch = {}

def ms(name):
    v = bench.get(name)
    return "n/a" if v is None else f"{v:.3f}"

def ratio(a, b):
    if a is None or b is None or a == 0:
        return "n/a"
    return f"{b / a:.1f}x"

def met(v, target):
    return "n/a" if v is None else ("yes" if v < target else "NO")

rows = [
    ("walk, layer 32 heads x 32768 tok, d 128, 2 rounds (authors' float32)", "BM_GpuWalkTwoRounds/layer_32x32k/f32", None, 2.0),
    ("walk, same, KVScope double walk (kvscope-v1)", "BM_GpuWalkTwoRounds/layer_32x32k/f64", None, None),
    ("walk, round 1 only", "BM_GpuWalkRound/layer_32x32k/0", None, None),
    ("walk, round 2 only", "BM_GpuWalkRound/layer_32x32k/1", None, None),
    ("walk, 1 head x 32768 tok, 2 rounds", "BM_GpuWalkTwoRounds/head_32k/f32", "BM_CpuWalkTwoRounds/head_32k", None),
    ("errors, 256 queries x 32 heads, n 8192 (double scores)", "BM_GpuErrors/layer_8k/double", None, 1.0),
    ("errors, 256 queries x 32 heads, n 32768 (double scores)", "BM_GpuErrors/layer_32k/double", None, 1.0),
    ("errors, same, n 8192, float scores", "BM_GpuErrors/layer_8k/float", None, 1.0),
    ("errors, same, n 32768, float scores", "BM_GpuErrors/layer_32k/float", None, 1.0),
    ("errors, n 8192, exact side kept (resident layer, double)", "BM_GpuErrorsExactKept/layer_8k/double", None, 1.0),
    ("errors, n 32768, exact side kept (resident layer, double)", "BM_GpuErrorsExactKept/layer_32k/double", None, 1.0),
    ("host-to-device copy of a layer's K and V, 8 kv heads x 8192", "BM_GpuUploadLayer/layer_8k", None, None),
    ("host-to-device copy of a layer's K and V, 8 kv heads x 32768", "BM_GpuUploadLayer/layer_32k", None, None),
    ("errors, 256 queries x 1 head, n 8192", "BM_GpuErrors/head_8k/double", "BM_CpuErrors/head_8k", None),
    ("t-SNE exact gradient, 8192 points", "BM_GpuTsneGradient/band_8k", "BM_CpuTsneGradientExact/band_8k", None),
    ("t-SNE exact gradient, 32768 points (x1000 < 1 s)", "BM_GpuTsneGradient/band_32k", None, 1.0),
    ("k-center, 32768 x 128, 256 centres", "BM_GpuKcenter/keys_32k", "BM_CpuKcenter/keys_32k", None),
]
print(f"### GPU measurements ({device})\n")
print("| operation | GPU ms | CPU ms | GPU speed-up | target | met |")
print("|---|---|---|---|---|---|")
for label, g, c, target in rows:
    gv = bench.get(g)
    cv = bench.get(c) if c else None
    print(f"| {label} | {ms(g)} | {ms(c) if c else '-'} | {ratio(gv, cv) if c else '-'} | "
          f"{'< %g ms' % target if target else '-'} | {met(gv, target) if target else '-'} |")
tw = torch.get("torch_walk_ms")
kw = bench.get("BM_GpuWalkTwoRounds/layer_32x32k/f32")
print()
if tw is not None:
    print(f"PyTorch walk (same layer, 2 rounds): {tw:.3f} ms; CUDA kernel speed-up: "
          f"{ratio(kw, tw)} (target >= 20x)")
else:
    print(f"PyTorch walk: not measured ({torch.get('error', 'no output')})")
PY

if [ $status -eq 0 ]; then echo "gpu_check: all steps passed"; else echo "gpu_check: some steps FAILED"; fi
exit $status
