// The hand-written intrinsics kernels of the SIMD tables (engine/core/simd.h, the entries after
// walk_gram_f32), defined in engine/core/simd/intrinsics_avx2.cpp and intrinsics_avx512.cpp, each
// compiled for its instruction set by CMake, and named in the tables by
// engine/core/simd/kernels.inc. Plain functions with external linkage and one definition each;
// everything they use inside their TU has internal linkage (see kernels.inc: the ODR trap of
// per-file ISA flags).
#pragma once

#include <cstdint>

#include "engine/core/simd.h"

namespace kvscope::simd::detail {

namespace avx2 {
void walk_gram_f64(const double* x, int ibegin, int iend, int dimp, int ldg, double* g);
void walk_pack_panels16(const float* x, int len, int dim, float* out);
void walk_kernel_rows_f32(const float* gk, const float* gv, int p0, int p1, int ld, float temp,
                          float sqrt_d, float beta, float eps, float bias, float* out,
                          char* tail_bad);
float walk_dot_f32(const float* k, const float* s, int i);
void column_sums_f32(const float* rows, const int* tokens, int count, int d, double* sum);
void tsne_row_terms(const float* y, const int* rowptr, const int* col, const uint16_t* col16,
                    const float* val, int i, double* fx, double* fy, double* kl, double* ps);
long tsne_gradient_step(const float* g, float* u, float* gain, float* y, long size, float momentum,
                        float lr, float min_gain);
void knn_scan_tile(const KnnPoints& p, int i0, int i1, int j0, int j1, const float* threshold,
                   void (*offer)(void* ctx, int i, int j, const float* dd, unsigned for_row,
                                 unsigned for_col),
                   void* ctx);
void knn_sample_ranks(const KnnPoints& p, const KnnPoints& sample, const int* sample_row, int rank,
                      int i0, int i1, float* estimate);
void knn_distances(const KnnPoints& p, int i, float* dd);
}  // namespace avx2

// The AVX-512 table's own kernels; its other entries are the AVX2 ones.
namespace avx512 {
void walk_gram_f64(const double* x, int ibegin, int iend, int dimp, int ldg, double* g);
void walk_kernel_rows_f32(const float* gk, const float* gv, int p0, int p1, int ld, float temp,
                          float sqrt_d, float beta, float eps, float bias, float* out,
                          char* tail_bad);
}  // namespace avx512

}  // namespace kvscope::simd::detail
