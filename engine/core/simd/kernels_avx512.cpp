// The engine's SIMD kernels for avx512 (see engine/core/simd/kernels.inc and engine/core/simd.h).
#define KVSCOPE_SIMD_BYTES 64
#define KVSCOPE_SIMD_TABLE avx512_table
#define KVSCOPE_SIMD_NAME "avx512"
#include "engine/core/simd/kernels.inc"
