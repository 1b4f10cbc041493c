#!/usr/bin/env bash
# Runs tests/test_cuda_parity.cpp and tests/test_cuda_resident.cpp against the REAL kernel sources executed by a CPU emulation of
# CUDA's execution model (emulated_cuda_runtime.h, installed as cuda_runtime.h: every thread of a block is a fiber, __syncthreads
# and warp shuffles are scheduler barriers, device memory is host memory). It checks the kernels'
# logic, indexing, barriers and numerics where no GPU is available; it is not a substitute for a
# device run (no memory model or warp timing, host libm instead of CUDA's math functions, no
# launch limits, and slow: a few minutes). tools/gpu_check.sh is the real check.
#
# Usage: kernels/emu/run_emulated_parity.sh BUILD_DIR [gtest args...]
#   BUILD_DIR: a build tree with libengine.a (CUDA on or off: the engine never references the
#   kernels; their objects below register the "cuda" backend themselves). EMU_REVERSE=1 runs each block's threads in reverse order between
#   barriers, which exposes missing barriers that the forward order hides.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:?usage: $0 BUILD_DIR [gtest args]}" && pwd)
shift
WORK=${KVSCOPE_EMU_DIR:-${TMPDIR:-/tmp}/kvscope-cuda-emu}
mkdir -p "$WORK/src" "$WORK/include"
cp "$ROOT/kernels/emu/emulated_cuda_runtime.h" "$WORK/include/cuda_runtime.h"
CXX=${CXX:-g++}
# Extra flags, e.g. EMU_CXXFLAGS="-fsanitize=address" for bounds checks on device buffers.
read -r -a EXTRA <<<"${EMU_CXXFLAGS:-}"
FLAGS=(-std=c++20 -O1 -g -w "${EXTRA[@]}" -I"$WORK/include" -I"$ROOT" -I/usr/include/eigen3)
objs=()
for f in "$ROOT"/kernels/*.cu; do
  base=$(basename "$f" .cu)
  python3 "$ROOT/kernels/emu/rewrite_launches.py" "$f" "$WORK/src/$base.cpp"
  "$CXX" "${FLAGS[@]}" -c "$WORK/src/$base.cpp" -o "$WORK/src/$base.o"
  objs+=("$WORK/src/$base.o")
done
# The device tests: the op parity tests and the resident-layer tests, one binary.
"$CXX" "${FLAGS[@]}" -DKVSCOPE_HAVE_CUDA=1 -DKVSCOPE_SOURCE_DIR="\"$ROOT\"" \
  "$ROOT/tests/test_cuda_parity.cpp" "$ROOT/tests/test_cuda_resident.cpp" "${objs[@]}" \
  "$BUILD/libengine.a" -o "$WORK/emu_parity" -lgtest -lgtest_main -lpthread -lz
"$WORK/emu_parity" "$@"
