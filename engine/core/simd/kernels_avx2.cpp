// The engine's SIMD kernels for avx2 (see engine/core/simd/kernels.inc and engine/core/simd.h).
#define KVSCOPE_SIMD_BYTES 32
#define KVSCOPE_SIMD_TABLE avx2_table
#define KVSCOPE_SIMD_NAME "avx2"
#include "engine/core/simd/kernels.inc"
