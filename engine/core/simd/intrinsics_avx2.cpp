// The AVX2 + FMA intrinsics kernels of the avx2 and avx512 tables (engine/core/simd.h, declared in
// engine/core/simd/intrinsics.h), compiled with -mavx2 -mfma and the build's -ffp-contract=off
// (CMakeLists.txt): a multiply and an add written apart stay apart, as in the portable code they
// match. Moved here unchanged from the engine files they serve (engine/ops/walk_blocks_cpu.cpp,
// engine/methods/balancekv/balance_walk.cpp, engine/ops/tsne_gradient_cpu.cpp,
// engine/geometry/tsne.cpp, engine/geometry/knn.cpp), which call them through simd::kernels().
//
// Only the entry points have external linkage; every helper is in the anonymous namespace and
// nothing inline from a standard header is used (the ODR trap, engine/core/simd/kernels.inc).
#include <immintrin.h>

#include <cstdint>

#include "engine/core/simd/intrinsics.h"

namespace kvscope::simd::detail::avx2 {
namespace {

inline int imin(int a, int b) {
  return a < b ? a : b;
}

// ---- The double walk's block Gram (Kernels::walk_gram_f64).
// G[i][j] = <x_i, x_j> for rows i in [ibegin, iend) and j <= i (plus a few entries above the
// diagonal inside the 2 x 4 tiles that straddle it). x: row-major, dim4 wide, zero-padded to a
// multiple of 4 rows (ibegin % 4 == 0, iend % 2 == 0, dim4 % 4 == 0); row i of the result goes to
// g + (i - ibegin) * ldg. Tiles of 2 rows i by 4 rows j keep 8 accumulators over c.
// [sum a, sum b, sum c, sum d] of four 4-lane accumulators.
inline __m256d reduce4(__m256d a, __m256d b, __m256d c, __m256d d) {
  const __m256d t0 = _mm256_hadd_pd(a, b), t1 = _mm256_hadd_pd(c, d);
  return _mm256_add_pd(_mm256_permute2f128_pd(t0, t1, 0x20), _mm256_permute2f128_pd(t0, t1, 0x31));
}

// ---- The float32 walk (Kernels::walk_pack_panels16, walk_kernel_rows_f32, walk_dot_f32).

// The 8 x 8 transpose of rows a[0..7] (8 floats each): out[k] = column k.
inline void transpose8(const __m256* a, __m256* out) {
  const __m256 t0 = _mm256_unpacklo_ps(a[0], a[1]), t1 = _mm256_unpackhi_ps(a[0], a[1]),
               t2 = _mm256_unpacklo_ps(a[2], a[3]), t3 = _mm256_unpackhi_ps(a[2], a[3]),
               t4 = _mm256_unpacklo_ps(a[4], a[5]), t5 = _mm256_unpackhi_ps(a[4], a[5]),
               t6 = _mm256_unpacklo_ps(a[6], a[7]), t7 = _mm256_unpackhi_ps(a[6], a[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
               u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
               u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
               u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  out[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  out[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  out[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  out[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  out[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  out[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  out[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  out[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// exp(x) for 8 floats: x = n ln2 + r, |r| <= ln2/2, 2^n times a degree-6 polynomial in r (within
// 2 ulp of the correctly rounded value); inf above the float range (as std::exp gives), 0 below
// it (std::exp would give a denormal there; a kernel entry below 1e-38 changes no sign), NaN
// passes through.
inline __m256 exp_f32(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.72283935546875f), lo = _mm256_set1_ps(-87.33654022216797f);
  const __m256 over = _mm256_cmp_ps(x, hi, _CMP_GT_OQ), under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo);  // NaN -> lo (restored below)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n in two factors so n = 128 (x near 88.72) does not overflow the exponent field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), over);
  y = _mm256_andnot_ps(under, y);
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// K_ij of the rows [r0, r1) of one group of 8 (rows 8m .. 8m + 7 all need j < 8m + 8: `nvec`
// = m + 1 vectors, the Gram rows holding real products up to there), row r of the Grams at
// gk/gv + (r - g0) * ld and of the output at out + r * ld. Vector by vector across the group's
// rows, so the exp chains of 8 rows overlap; flags tail_bad[j] for a non-finite K_rj with j <= r.
void kernel_rows_group(const float* gk, const float* gv, int g0, float* out, int ld, int r0, int r1,
                       int nvec, float temp, float sqrt_d, float beta, float eps, float bias,
                       char* tail_bad) {
  const __m256 vt = _mm256_set1_ps(temp), vs = _mm256_set1_ps(sqrt_d), vb = _mm256_set1_ps(beta);
  const __m256 ve = _mm256_set1_ps(eps), vbias = _mm256_set1_ps(bias);
  const __m256 big = _mm256_set1_ps(__FLT_MAX__);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 any_bad = _mm256_setzero_ps();
  for (int v = 0; v < nvec; ++v) {
    const long j = 8L * v;
    for (int r = r0; r < r1; ++r) {
      const long at = static_cast<long>(r - g0) * ld + j;
      const __m256 arg =
          _mm256_sub_ps(_mm256_div_ps(_mm256_mul_ps(vt, _mm256_loadu_ps(gk + at)), vs), vb);
      const __m256 vterm = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(gv + at), ve), vbias);
      const __m256 k = _mm256_mul_ps(exp_f32(arg), vterm);
      _mm256_storeu_ps(out + static_cast<long>(r) * ld + j, k);
      // Not finite: |k| above the largest float (inf), or NaN (unordered).
      any_bad = _mm256_or_ps(any_bad, _mm256_cmp_ps(_mm256_and_ps(k, abs_mask), big, _CMP_NLE_UQ));
    }
  }
  // Rare (an overflowing kernel entry): find which entries.
  if (_mm256_movemask_ps(any_bad))
    for (int r = r0; r < r1; ++r)
      for (int l = 0; l <= r; ++l)
        if (!__builtin_isfinite(out[static_cast<long>(r) * ld + l])) tail_bad[l] = 1;
}

// ---- t-SNE (Kernels::tsne_row_terms).

// The 8 neighbours' coordinates, y_j for j = col[0..7], as x and y lanes in neighbour order:
// each (x, y) pair is one 64-bit load (a gather instruction measured slower on Zen 3), pairs 0, 1,
// 4, 5 in a and 2, 3, 6, 7 in b so that one in-lane shuffle each separates x from y.
template <class Index>
inline void load_neighbours(const float* y, const Index* col, __m256& xs, __m256& ys) {
  auto pair = [&](int l) {
    return reinterpret_cast<const __m64*>(y + 2 * static_cast<long>(col[l]));
  };
  const __m128 p01 = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), pair(0)), pair(1));
  const __m128 p23 = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), pair(2)), pair(3));
  const __m128 p45 = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), pair(4)), pair(5));
  const __m128 p67 = _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), pair(6)), pair(7));
  const __m256 a = _mm256_set_m128(p45, p01), b = _mm256_set_m128(p67, p23);
  xs = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  ys = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
}

// The 8 lanes of v summed in double, lane 0 first (a fixed order).
inline double lane_sum(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  double s = 0;
  for (float x : l) s += x;
  return s;
}

// engine/ops/tsne_gradient_cpu.cpp's vector_log (its portable KL rows use it), the same
// arithmetic: log(x) for a normal float x > 0, x = m 2^e, log m = 2 atanh((m - 1) / (m + 1)).
inline float vector_log(float x) {
  int32_t bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  bits = (bits & 0x007fffff) | 0x3f800000;
  float m;
  __builtin_memcpy(&m, &bits, sizeof m);
  const bool high = m > 1.41421356f;
  m = high ? m * 0.5f : m;
  e = high ? e + 1 : e;
  const float s = (m - 1) / (m + 1), s2 = s * s;
  const float series = 1 + s2 * (1.f / 3 + s2 * (1.f / 5 + s2 * (1.f / 7 + s2 * (1.f / 9))));
  return static_cast<float>(e) * 0.693147180559945f + 2 * s * series;
}

// vector_log for 8 floats (normal, positive inputs).
inline __m256 log8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  __m256i e =
      _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xff)),
                       _mm256_set1_epi32(127));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f800000)));
  const __m256 high = _mm256_cmp_ps(m, _mm256_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, _mm256_set1_ps(0.5f)), high);
  e = _mm256_sub_epi32(e, _mm256_castps_si256(high));  // high lanes are all ones: e + 1
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 s = _mm256_div_ps(_mm256_sub_ps(m, one), _mm256_add_ps(m, one));
  const __m256 s2 = _mm256_mul_ps(s, s);
  __m256 series = _mm256_fmadd_ps(s2, _mm256_set1_ps(1.f / 9), _mm256_set1_ps(1.f / 7));
  series = _mm256_fmadd_ps(s2, series, _mm256_set1_ps(1.f / 5));
  series = _mm256_fmadd_ps(s2, series, _mm256_set1_ps(1.f / 3));
  series = _mm256_fmadd_ps(s2, series, one);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(e), _mm256_set1_ps(0.693147180559945f),
                         _mm256_mul_ps(_mm256_add_ps(s, s), series));
}

// The portable attraction (and with kKl the KL row) in one pass over the row, with 8 neighbours
// per step in the lanes of one vector (the same float terms; the sums associate differently, so
// results agree with the portable ones to float rounding, not bit for bit).
template <bool kKl, class Index>
void row_terms(const float* y, const int* rowptr, const Index* col, const float* val, int i,
               double& fx, double& fy, double* kl, double* ps) {
  const __m256 xi = _mm256_set1_ps(y[2 * i]), yi = _mm256_set1_ps(y[2 * i + 1]);
  const __m256 one = _mm256_set1_ps(1.f), tiny = _mm256_set1_ps(1e-30f);
  __m256 ax = _mm256_setzero_ps(), ay = ax, akl = ax, aps = ax;
  int k = rowptr[i];
  const int end = rowptr[i + 1];
  for (; k + 8 <= end; k += 8) {
    __m256 xs, ys;
    load_neighbours(y, col + k, xs, ys);
    const __m256 dx = _mm256_sub_ps(xi, xs), dy = _mm256_sub_ps(yi, ys);
    const __m256 p = _mm256_loadu_ps(val + k);
    const __m256 den = _mm256_fmadd_ps(dy, dy, _mm256_fmadd_ps(dx, dx, one));
    const __m256 pq = _mm256_div_ps(p, den);
    ax = _mm256_fmadd_ps(pq, dx, ax);
    ay = _mm256_fmadd_ps(pq, dy, ay);
    if constexpr (kKl) {
      // p log p -> 0 as p -> 0: below 1e-30 the term is dropped.
      const __m256 keep = _mm256_cmp_ps(p, tiny, _CMP_GT_OQ);
      const __m256 pd = _mm256_blendv_ps(one, _mm256_mul_ps(p, den), keep);
      akl = _mm256_add_ps(akl, _mm256_and_ps(keep, _mm256_mul_ps(p, log8(pd))));
      aps = _mm256_add_ps(aps, p);
    }
  }
  fx = lane_sum(ax), fy = lane_sum(ay);
  if constexpr (kKl) *kl = lane_sum(akl), *ps = lane_sum(aps);
  const float xs = y[2 * i], ysc = y[2 * i + 1];
  for (; k < end; ++k) {
    const int j = col[k];
    const float p = val[k];
    const float dx = xs - y[2 * j], dy = ysc - y[2 * j + 1];
    const float den = 1.f + dx * dx + dy * dy;
    const float pq = p / den;
    fx += pq * dx;
    fy += pq * dy;
    if constexpr (kKl) {
      if (p > 1e-30f) *kl += p * vector_log(p * den);
      *ps += p;
    }
  }
}

// ---- The brute-force kNN (Kernels::knn_*).
constexpr int kPanel = kKnnPanel;  // columns of a packed panel: two AVX2 vectors
constexpr int kRows = kKnnRows;    // rows of the register block (6 x 16 accumulators)
static_assert(kPanel == 16 && kRows == 6, "dot_block's register block");

// The dot products of 6 consecutive rows (from a, d floats apart) with the 16 points of a panel:
// one fused multiply-add per dimension in order, in 12 accumulators.
struct DotBlock {
  __m256 v[kRows][2];
};
__attribute__((always_inline)) inline DotBlock dot_block(const float* a, int d,
                                                         const float* panel) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int c = 0; c < d; ++c) {
    const __m256 b0 = _mm256_load_ps(panel + c * kPanel);
    const __m256 b1 = _mm256_load_ps(panel + c * kPanel + 8);
    __m256 v = _mm256_broadcast_ss(a + c);
    c00 = _mm256_fmadd_ps(v, b0, c00);
    c01 = _mm256_fmadd_ps(v, b1, c01);
    v = _mm256_broadcast_ss(a + d + c);
    c10 = _mm256_fmadd_ps(v, b0, c10);
    c11 = _mm256_fmadd_ps(v, b1, c11);
    v = _mm256_broadcast_ss(a + 2 * d + c);
    c20 = _mm256_fmadd_ps(v, b0, c20);
    c21 = _mm256_fmadd_ps(v, b1, c21);
    v = _mm256_broadcast_ss(a + 3 * d + c);
    c30 = _mm256_fmadd_ps(v, b0, c30);
    c31 = _mm256_fmadd_ps(v, b1, c31);
    v = _mm256_broadcast_ss(a + 4 * d + c);
    c40 = _mm256_fmadd_ps(v, b0, c40);
    c41 = _mm256_fmadd_ps(v, b1, c41);
    v = _mm256_broadcast_ss(a + 5 * d + c);
    c50 = _mm256_fmadd_ps(v, b0, c50);
    c51 = _mm256_fmadd_ps(v, b1, c51);
  }
  return DotBlock{{{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}}};
}

}  // namespace

void walk_gram_f64(const double* x, int ibegin, int iend, int dim4, int ldg, double* g) {
  for (int i0 = ibegin; i0 < iend; i0 += 2) {
    const double* xi0 = x + static_cast<long>(i0) * dim4;
    const double* xi1 = xi0 + dim4;
    for (int j0 = 0; j0 <= i0 + 1; j0 += 4) {
      const double* xj = x + static_cast<long>(j0) * dim4;
      __m256d a00 = _mm256_setzero_pd(), a01 = _mm256_setzero_pd();
      __m256d a02 = _mm256_setzero_pd(), a03 = _mm256_setzero_pd();
      __m256d a10 = _mm256_setzero_pd(), a11 = _mm256_setzero_pd();
      __m256d a12 = _mm256_setzero_pd(), a13 = _mm256_setzero_pd();
      for (int c = 0; c < dim4; c += 4) {
        const __m256d u0 = _mm256_loadu_pd(xi0 + c), u1 = _mm256_loadu_pd(xi1 + c);
        __m256d v = _mm256_loadu_pd(xj + c);
        a00 = _mm256_fmadd_pd(u0, v, a00);
        a10 = _mm256_fmadd_pd(u1, v, a10);
        v = _mm256_loadu_pd(xj + dim4 + c);
        a01 = _mm256_fmadd_pd(u0, v, a01);
        a11 = _mm256_fmadd_pd(u1, v, a11);
        v = _mm256_loadu_pd(xj + 2 * dim4 + c);
        a02 = _mm256_fmadd_pd(u0, v, a02);
        a12 = _mm256_fmadd_pd(u1, v, a12);
        v = _mm256_loadu_pd(xj + 3 * dim4 + c);
        a03 = _mm256_fmadd_pd(u0, v, a03);
        a13 = _mm256_fmadd_pd(u1, v, a13);
      }
      _mm256_storeu_pd(g + static_cast<long>(i0 - ibegin) * ldg + j0, reduce4(a00, a01, a02, a03));
      _mm256_storeu_pd(g + static_cast<long>(i0 + 1 - ibegin) * ldg + j0,
                       reduce4(a10, a11, a12, a13));
    }
  }
}

// Panel t holds rows 16t .. 16t + 15 feature by feature, x[16t + r][c] at out[(t * dim + c) * 16
// + r]; rows past the last repeat it (the entries they give lie beyond the block and are never
// read). Both 8-row halves of a panel are transposed together, so each feature's 64 bytes are
// written whole.
void walk_pack_panels16(const float* x, int len, int dim, float* out) {
  const int last = len - 1;
  for (int r0 = 0; r0 < len; r0 += 16, out += static_cast<long>(dim) * 16) {
    const float* row[16];
    for (int r = 0; r < 16; ++r) row[r] = x + static_cast<long>(imin(r0 + r, last)) * dim;
    int c = 0;
    for (; c + 8 <= dim; c += 8) {
      __m256 a[8], lo[8], hi[8];
      for (int r = 0; r < 8; ++r) a[r] = _mm256_loadu_ps(row[r] + c);
      transpose8(a, lo);
      for (int r = 0; r < 8; ++r) a[r] = _mm256_loadu_ps(row[8 + r] + c);
      transpose8(a, hi);
      float* o = out + c * 16;
      for (int k = 0; k < 8; ++k) {
        _mm256_storeu_ps(o + k * 16, lo[k]);
        _mm256_storeu_ps(o + k * 16 + 8, hi[k]);
      }
    }
    for (; c < dim; ++c)
      for (int r = 0; r < 16; ++r) out[c * 16 + r] = row[r][c];
  }
}

void walk_kernel_rows_f32(const float* gk, const float* gv, int p0, int p1, int ld, float temp,
                          float sqrt_d, float beta, float eps, float bias, float* out,
                          char* tail_bad) {
  for (int r0 = p0; r0 < p1; r0 = (r0 / 8 + 1) * 8)
    kernel_rows_group(gk, gv, p0, out, ld, r0, imin(p1, (r0 / 8 + 1) * 8), r0 / 8 + 1, temp, sqrt_d,
                      beta, eps, bias, tail_bad);
}

float walk_dot_f32(const float* k, const float* s, int i) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int j = 0;
  for (; j + 16 <= i; j += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + j), _mm256_loadu_ps(s + j), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(k + j + 8), _mm256_loadu_ps(s + j + 8), a1);
  }
  for (; j + 8 <= i; j += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(k + j), _mm256_loadu_ps(s + j), a0);
  a0 = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float acc = _mm_cvtss_f32(h);
  for (; j < i; ++j) acc += k[j] * s[j];
  return acc;
}

// 32 columns in 8 registers per pass over the rows: each column's sum is one chain of dependent
// adds, and 8 chains (not 4) keep both add units busy past the add latency.
void column_sums_f32(const float* rows, const int* tokens, int count, int d, double* sum) {
  int c0 = 0;
  for (; c0 + 32 <= d; c0 += 32) {
    __m256d a[8];
    for (__m256d& v : a) v = _mm256_setzero_pd();
    for (int i = 0; i < count; ++i) {
      const float* k = rows + static_cast<long>(tokens[i]) * d + c0;
      for (int q = 0; q < 8; ++q)
        a[q] = _mm256_add_pd(a[q], _mm256_cvtps_pd(_mm_loadu_ps(k + 4 * q)));
    }
    for (int q = 0; q < 8; ++q) _mm256_storeu_pd(sum + c0 + 4 * q, a[q]);
  }
  for (; c0 + 4 <= d; c0 += 4) {
    __m256d a = _mm256_setzero_pd();
    for (int i = 0; i < count; ++i)
      a = _mm256_add_pd(
          a, _mm256_cvtps_pd(_mm_loadu_ps(rows + static_cast<long>(tokens[i]) * d + c0)));
    _mm256_storeu_pd(sum + c0, a);
  }
  for (; c0 < d; ++c0) {
    double a = 0;
    for (int i = 0; i < count; ++i) a += rows[static_cast<long>(tokens[i]) * d + c0];
    sum[c0] = a;
  }
}

void tsne_row_terms(const float* y, const int* rowptr, const int* col, const uint16_t* col16,
                    const float* val, int i, double* fx, double* fy, double* kl, double* ps) {
  if (kl) {
    if (col16) return row_terms<true>(y, rowptr, col16, val, i, *fx, *fy, kl, ps);
    return row_terms<true>(y, rowptr, col, val, i, *fx, *fy, kl, ps);
  }
  if (col16) return row_terms<false>(y, rowptr, col16, val, i, *fx, *fy, kl, ps);
  return row_terms<false>(y, rowptr, col, val, i, *fx, *fy, kl, ps);
}

long tsne_gradient_step(const float* g, float* u, float* gain, float* y, long size, float momentum,
                        float lr, float min_gain) {
  const __m256 vm = _mm256_set1_ps(momentum), vlr = _mm256_set1_ps(lr);
  const __m256 vmin = _mm256_set1_ps(min_gain), up = _mm256_set1_ps(0.2f);
  const __m256 down = _mm256_set1_ps(0.8f), zero = _mm256_setzero_ps();
  long c = 0;
  for (; c + 8 <= size; c += 8) {
    const __m256 gc = _mm256_loadu_ps(g + c), uc = _mm256_loadu_ps(u + c);
    const __m256 ga = _mm256_loadu_ps(gain + c);
    const __m256 flipped = _mm256_cmp_ps(_mm256_mul_ps(uc, gc), zero, _CMP_LT_OQ);
    __m256 gn = _mm256_blendv_ps(_mm256_mul_ps(ga, down), _mm256_add_ps(ga, up), flipped);
    gn = _mm256_max_ps(vmin, gn);  // gn < min_gain ? min_gain : gn
    const __m256 un =
        _mm256_sub_ps(_mm256_mul_ps(vm, uc), _mm256_mul_ps(_mm256_mul_ps(vlr, gn), gc));
    _mm256_storeu_ps(gain + c, gn);
    _mm256_storeu_ps(u + c, un);
    _mm256_storeu_ps(y + c, _mm256_add_ps(_mm256_loadu_ps(y + c), un));
  }
  return c;
}

// A 6 x 16 register block over the whole dimension, its distances compared while still in
// registers (the Gram block is never written out). Panels of the column block stay in L1 while
// the tile's rows stream from L2.
void knn_scan_tile(const KnnPoints& p, int i0, int i1, int j0, int j1, const float* threshold,
                   void (*offer)(void* ctx, int i, int j, const float* dd, unsigned for_row,
                                 unsigned for_col),
                   void* ctx) {
  const int d = p.d;
  const bool diagonal = i0 == j0;
  const __m256 minus_two = _mm256_set1_ps(-2.f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int j = j0; j < j1; j += kPanel) {
    const float* panel = p.panels + static_cast<long>(j) * d;
    const __m256 nj0 = _mm256_load_ps(p.norms + j);
    const __m256 nj1 = _mm256_load_ps(p.norms + j + 8);
    const __m256i col0 = _mm256_add_epi32(_mm256_set1_epi32(j), lane);
    const __m256i col1 = _mm256_add_epi32(col0, _mm256_set1_epi32(8));
    // On the diagonal tile, rows from j + 15 on have no column above them in this panel.
    const int row_end = diagonal ? imin(i1, j + kPanel - 1) : i1;
    for (int i = i0; i < row_end; i += kRows) {
      const DotBlock acc = dot_block(p.rows + static_cast<long>(i) * d, d, panel);
      const int rows = imin(kRows, i1 - i);
      for (int r = 0; r < rows; ++r) {
        const int row = i + r;
        // d = |a|^2 + |b|^2 - 2 a.b, the same value for both points of the pair.
        const __m256 ni = _mm256_set1_ps(p.norms[row]);
        const __m256 d0 = _mm256_fmadd_ps(minus_two, acc.v[r][0], _mm256_add_ps(ni, nj0));
        const __m256 d1 = _mm256_fmadd_ps(minus_two, acc.v[r][1], _mm256_add_ps(ni, nj1));
        const __m256 wi = _mm256_set1_ps(threshold[row]);
        const float* wj = threshold + j;
        __m256 r0 = _mm256_cmp_ps(d0, wi, _CMP_LE_OQ), r1 = _mm256_cmp_ps(d1, wi, _CMP_LE_OQ);
        __m256 q0 = _mm256_cmp_ps(d0, _mm256_loadu_ps(wj), _CMP_LE_OQ);
        __m256 q1 = _mm256_cmp_ps(d1, _mm256_loadu_ps(wj + 8), _CMP_LE_OQ);
        if (diagonal) {
          const __m256i rv = _mm256_set1_epi32(row);
          const __m256 above0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(col0, rv));
          const __m256 above1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(col1, rv));
          r0 = _mm256_and_ps(r0, above0);
          r1 = _mm256_and_ps(r1, above1);
          q0 = _mm256_and_ps(q0, above0);
          q1 = _mm256_and_ps(q1, above1);
        }
        const unsigned for_row =
            unsigned(_mm256_movemask_ps(r0)) | (unsigned(_mm256_movemask_ps(r1)) << 8);
        const unsigned for_col =
            unsigned(_mm256_movemask_ps(q0)) | (unsigned(_mm256_movemask_ps(q1)) << 8);
        if (for_row | for_col) {
          alignas(32) float dd[kPanel];
          _mm256_store_ps(dd, d0);
          _mm256_store_ps(dd + 8, d1);
          offer(ctx, row, j, dd, for_row, for_col);
        }
      }
    }
  }
}

void knn_sample_ranks(const KnnPoints& p, const KnnPoints& s, const int* sample_row, int rank,
                      int i0, int i1, float* estimate) {
  const int d = p.d;
  const __m256 minus_two = _mm256_set1_ps(-2.f);
  const float inf = __builtin_inff();
  for (int i = i0; i < i1; i += kRows) {
    const int rows = imin(kRows, i1 - i);
    float best[kRows][kKnnMaxRank];  // ascending
    int kept[kRows] = {};
    float bound[kRows];
    for (float& b : bound) b = inf;
    for (int j = 0; j < s.n; j += kPanel) {
      const DotBlock acc =
          dot_block(p.rows + static_cast<long>(i) * d, d, s.panels + static_cast<long>(j) * d);
      const __m256 nj0 = _mm256_load_ps(s.norms + j);
      const __m256 nj1 = _mm256_load_ps(s.norms + j + 8);
      const __m256i id0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sample_row + j));
      const __m256i id1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sample_row + j + 8));
      for (int r = 0; r < rows; ++r) {
        const __m256 ni = _mm256_set1_ps(p.norms[i + r]);
        const __m256 d0 = _mm256_fmadd_ps(minus_two, acc.v[r][0], _mm256_add_ps(ni, nj0));
        const __m256 d1 = _mm256_fmadd_ps(minus_two, acc.v[r][1], _mm256_add_ps(ni, nj1));
        const __m256 b = _mm256_set1_ps(bound[r]);
        const __m256i self = _mm256_set1_epi32(i + r);
        const __m256 m0 = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(id0, self)),
                                           _mm256_cmp_ps(d0, b, _CMP_LT_OQ));
        const __m256 m1 = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(id1, self)),
                                           _mm256_cmp_ps(d1, b, _CMP_LT_OQ));
        unsigned bits = unsigned(_mm256_movemask_ps(m0)) | (unsigned(_mm256_movemask_ps(m1)) << 8);
        if (!bits) continue;
        alignas(32) float dd[kPanel];
        _mm256_store_ps(dd, d0);
        _mm256_store_ps(dd + 8, d1);
        float* list = best[r];
        while (bits) {
          const float v = dd[__builtin_ctz(bits)];
          bits &= bits - 1;
          if (v >= bound[r]) continue;
          int at = kept[r] < rank ? kept[r]++ : rank - 1;
          for (; at > 0 && list[at - 1] > v; --at) list[at] = list[at - 1];
          list[at] = v;
          if (kept[r] == rank) bound[r] = list[rank - 1];
        }
      }
    }
    for (int r = 0; r < rows; ++r) estimate[i + r] = bound[r];
  }
}

// Four panels at a time, so that eight accumulators hide the multiply-add latency.
void knn_distances(const KnnPoints& p, int i, float* dd) {
  const int d = p.d;
  const float* a = p.rows + static_cast<long>(i) * d;
  const __m256 minus_two = _mm256_set1_ps(-2.f);
  const __m256 ni = _mm256_set1_ps(p.norms[i]);
  constexpr int kWide = 4 * kPanel;
  for (int j0 = 0; j0 < p.n; j0 += kWide) {
    __m256 acc[8];
    for (__m256& v : acc) v = _mm256_setzero_ps();
    const float* panel = p.panels + static_cast<long>(j0) * d;
    for (int c = 0; c < d; ++c) {
      const __m256 v = _mm256_broadcast_ss(a + c);
      for (int q = 0; q < 8; ++q) {
        const float* b = panel + static_cast<long>(q / 2) * kPanel * d + c * kPanel + (q % 2) * 8;
        acc[q] = _mm256_fmadd_ps(v, _mm256_load_ps(b), acc[q]);
      }
    }
    for (int q = 0; q < 8; ++q) {
      const __m256 nj = _mm256_load_ps(p.norms + j0 + q * 8);
      _mm256_storeu_ps(dd + j0 + q * 8, _mm256_fmadd_ps(minus_two, acc[q], _mm256_add_ps(ni, nj)));
    }
  }
}

}  // namespace kvscope::simd::detail::avx2
