// The engine's SIMD kernels for sse2 (see engine/core/simd/kernels.inc and engine/core/simd.h).
#define KVSCOPE_SIMD_BYTES 16
#define KVSCOPE_SIMD_TABLE sse2_table
#define KVSCOPE_SIMD_NAME "sse2"
#include "engine/core/simd/kernels.inc"
