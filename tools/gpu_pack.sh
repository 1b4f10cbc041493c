#!/usr/bin/env bash
# Packs a CUDA build made here for a GPU machine that lacks the build dependencies (no Eigen,
# GoogleTest, ...): the executables (debug info stripped), the CTest files and ../shared's golden
# data and models, into .carry/bundle.tgz (list /.carry/ in .git/info/exclude). On the GPU machine
# tools/gpu_device_run.sh unpacks it and runs the CTest suite and tools/gpu_check.sh.
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSCOPE_NATIVE=OFF \
#         -DKVSCOPE_BUILD_APP=OFF && cmake --build build-gpu && tools/gpu_pack.sh build-gpu
# (optionally BEFORE=<an earlier kvscope-cli> tools/gpu_pack.sh build-gpu: see below)
# (KVSCOPE_NATIVE=OFF: the GPU machine's CPU differs; the SIMD kernels dispatch at run time.)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-gpu}
rm -rf .carry && mkdir -p .carry/stage
find $B -type f \( -perm -u+x -o -name "*.cmake" \) ! -path "*/CMakeFiles/*" ! -name "*.so" ! -name "*.a" | while read f; do
  mkdir -p ".carry/stage/$(dirname $f)"; cp "$f" ".carry/stage/$f"
done
find .carry/stage -type f -perm -u+x -exec sh -c 'file "$1" | grep -q ELF && strip --strip-debug "$1"' _ {} \;
# Shared libraries a bare GPU machine lacks (Google Benchmark, stb, zlib: every library an
# executable links besides the C and C++ runtimes); tools/gpu_device_run.sh and
# tools/gpu_device_check.sh put build-gpu/carried-lib on LD_LIBRARY_PATH.
mkdir -p .carry/stage/$B/carried-lib
find .carry/stage -type f -perm -u+x | while read -r exe; do
  file "$exe" | grep -q ELF || continue
  ldd "$exe" | awk '$3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
    xargs -r -I{} cp -L {} .carry/stage/$B/carried-lib/
done
# BEFORE=path/to/an/earlier/kvscope-cli: carried as $B/kvscope-cli.before, which the device run
# times alternately with this build's (same machine, same minutes).
if [ -n "${BEFORE:-}" ]; then cp "$BEFORE" ".carry/stage/$B/kvscope-cli.before" && strip --strip-debug ".carry/stage/$B/kvscope-cli.before"; fi
mkdir -p .carry/stage/shared && cp -r ../shared/golden ../shared/models .carry/stage/shared/
tar -C .carry/stage -czf .carry/bundle.tgz . && rm -rf .carry/stage
du -sh .carry/bundle.tgz
