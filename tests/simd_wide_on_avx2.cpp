// The AVX-512 table's code at its own width (64-byte vectors), compiled for AVX2 so this test can
// run it on a CPU without AVX-512: GCC splits each vector operation into two 32-byte ones, which
// changes no result (every lane is computed alone), so the tile shapes, panel offsets and edges
// of the wide table are checked bit for bit wherever the tests run. (Instruction selection for
// AVX-512 itself is the compiler's; the real table runs where the CPU has it.)
#include "engine/core/simd.h"

namespace kvscope::simd::detail {
extern const Kernels avx512_width_on_avx2_table;  // external linkage for tests/test_simd.cpp
}

#define KVSCOPE_SIMD_BYTES 64
#define KVSCOPE_SIMD_TABLE avx512_width_on_avx2_table
#define KVSCOPE_SIMD_NAME "avx512-width-on-avx2"
#define KVSCOPE_SIMD_WIDTH_ONLY 1
#include "engine/core/simd/kernels.inc"
