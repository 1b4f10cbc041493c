// The engine's SIMD kernels for scalar (see engine/core/simd/kernels.inc and engine/core/simd.h).
#define KVSCOPE_SIMD_BYTES 8
#define KVSCOPE_SIMD_TABLE scalar_table
#define KVSCOPE_SIMD_NAME "scalar"
#include "engine/core/simd/kernels.inc"
