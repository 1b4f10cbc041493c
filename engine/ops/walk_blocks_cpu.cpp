// The CPU reference of the walk op (Backend::walk_blocks, engine/ops/walk_blocks.h): one
// self-balancing walk per block of a WalkBatch, in float32 (the authors' semantics) or double. The
// rounds, halving and weights around it are engine/balance_walk.cpp's; the CUDA kernel
// (kernels/walk.cu) is tested against this file (tests/test_cuda_parity.cpp).
#include "engine/ops/walk_blocks_cpu.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "engine/balance_walk.h"
#include "engine/ops/walk_blocks.h"
#include "engine/random.h"
#include "engine/simd.h"

namespace kvscope {

// ---------------------------------------------------------------------------------------------
// The CPU reference of Backend::walk_blocks.
//
// Per block the walk needs K_ij for j < i only (the strictly lower triangle), so we form the two
// block Gram matrices <k_i,k_j> and <v_i,v_j> in double (the product of two floats is exact in
// double; only the accumulation rounds), then run the sequential walk on them. Cost per block of
// L rows: L^2 (d + dv) / 2 multiply-adds for the Grams, L^2 / 2 exponentials and L^2 / 2
// multiply-adds for the walk. The Grams dominate; the build targets baseline x86-64 (SSE2), so on
// CPUs with AVX2+FMA (or AVX-512) a hand-blocked kernel compiled for that target is chosen at
// run time (same
// double arithmetic, fused multiply-adds; results agree with the portable path to ~1e-16
// relative). Buffers are thread-local so repeated calls (live slider moves) do not allocate.

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
#define KVS_GRAM_AVX2 1
// G[i][j] = <x_i, x_j> for rows i in [ibegin, iend) and j <= i (plus a few entries above the
// diagonal inside the 2 x 4 tiles that straddle it). x: row-major, dim4 wide, zero-padded to a
// multiple of 4 rows (ibegin % 4 == 0, iend % 2 == 0, dim4 % 4 == 0); row i of the result goes to
// g + (i - ibegin) * ldg. Tiles of 2 rows i by 4 rows j keep 8 accumulators over c.
// [sum a, sum b, sum c, sum d] of four 4-lane accumulators.
__attribute__((target("avx2,fma"))) inline __m256d reduce4(__m256d a, __m256d b, __m256d c,
                                                           __m256d d) {
  const __m256d t0 = _mm256_hadd_pd(a, b), t1 = _mm256_hadd_pd(c, d);
  return _mm256_add_pd(_mm256_permute2f128_pd(t0, t1, 0x20), _mm256_permute2f128_pd(t0, t1, 0x31));
}

__attribute__((target("avx2,fma"))) void gram_lower_avx2(const double* x, int ibegin, int iend,
                                                         int dim4, int ldg, double* g) {
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

// The same tiles with 8-lane vectors where AVX-512 is present (half the multiply-add count).
// GCC 12's AVX-512 intrinsic headers trip -Wmaybe-uninitialized on their own
// _mm*_undefined_pd() placeholders (a known false positive); silence it for these two functions.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Sum of the two 4-lane halves of an 8-lane vector.
__attribute__((target("avx512f,avx2,fma"))) inline __m256d halves(__m512d a) {
  return _mm256_add_pd(_mm512_castpd512_pd256(a),
                       _mm512_castpd512_pd256(_mm512_shuffle_f64x2(a, a, 0xEE)));
}

__attribute__((target("avx512f,avx2,fma"))) void gram_lower_avx512(const double* x, int ibegin,
                                                                   int iend, int dim8, int ldg,
                                                                   double* g) {
  for (int i0 = ibegin; i0 < iend; i0 += 2) {
    const double* xi0 = x + static_cast<long>(i0) * dim8;
    const double* xi1 = xi0 + dim8;
    for (int j0 = 0; j0 <= i0 + 1; j0 += 4) {
      const double* xj = x + static_cast<long>(j0) * dim8;
      __m512d a00 = _mm512_setzero_pd(), a01 = _mm512_setzero_pd();
      __m512d a02 = _mm512_setzero_pd(), a03 = _mm512_setzero_pd();
      __m512d a10 = _mm512_setzero_pd(), a11 = _mm512_setzero_pd();
      __m512d a12 = _mm512_setzero_pd(), a13 = _mm512_setzero_pd();
      for (int c = 0; c < dim8; c += 8) {
        const __m512d u0 = _mm512_loadu_pd(xi0 + c), u1 = _mm512_loadu_pd(xi1 + c);
        __m512d v = _mm512_loadu_pd(xj + c);
        a00 = _mm512_fmadd_pd(u0, v, a00);
        a10 = _mm512_fmadd_pd(u1, v, a10);
        v = _mm512_loadu_pd(xj + dim8 + c);
        a01 = _mm512_fmadd_pd(u0, v, a01);
        a11 = _mm512_fmadd_pd(u1, v, a11);
        v = _mm512_loadu_pd(xj + 2 * dim8 + c);
        a02 = _mm512_fmadd_pd(u0, v, a02);
        a12 = _mm512_fmadd_pd(u1, v, a12);
        v = _mm512_loadu_pd(xj + 3 * dim8 + c);
        a03 = _mm512_fmadd_pd(u0, v, a03);
        a13 = _mm512_fmadd_pd(u1, v, a13);
      }
      _mm256_storeu_pd(g + static_cast<long>(i0 - ibegin) * ldg + j0,
                       reduce4(halves(a00), halves(a01), halves(a02), halves(a03)));
      _mm256_storeu_pd(g + static_cast<long>(i0 + 1 - ibegin) * ldg + j0,
                       reduce4(halves(a10), halves(a11), halves(a12), halves(a13)));
    }
  }
}

#pragma GCC diagnostic pop

// What the CPU runs, asked once (the detection itself is engine/simd.cpp's).
bool cpu_has_avx512() {
  static const bool yes = simd::cpu_supports("avx512");
  return yes;
}

bool cpu_has_avx2_fma() {
  static const bool yes = simd::cpu_supports("avx2");
  return yes;
}
#endif

// Lower triangle of the Gram matrix of `len` float rows (dim wide) into g (row stride ldg()).
std::atomic<bool> g_walk_simd{true};

// Rows of the lower-triangular Gram matrix of one block, computed a panel of rows at a time so
// memory stays panel x L even for long blocks.
class BlockGram {
 public:
  static constexpr int kPanel = 256;  // multiple of 4

  // Loads `len` float rows of width `dim`.
  void load(const float* rows, int len, int dim) {
    len_ = len;
#ifdef KVS_GRAM_AVX2
    simd_ = g_walk_simd.load(std::memory_order_relaxed) && cpu_has_avx2_fma();
    wide_ = simd_ && cpu_has_avx512();
    if (simd_) {
      const int rows4 = (len + 3) / 4 * 4;
      dimp_ = wide_ ? (dim + 7) / 8 * 8 : (dim + 3) / 4 * 4;
      ld_ = rows4;
      x_.resize(static_cast<size_t>(rows4) * dimp_);
      for (int i = 0; i < rows4; ++i) {
        double* dst = x_.data() + static_cast<size_t>(i) * dimp_;
        const float* src = rows + static_cast<long>(i) * dim;
        const int have = i < len ? dim : 0;
        for (int c = 0; c < have; ++c) dst[c] = src[c];
        for (int c = have; c < dimp_; ++c) dst[c] = 0.0;
      }
      return;
    }
#endif
    ld_ = len;
    xd_ = Eigen::Map<const MatrixF>(rows, len, dim).cast<double>();
  }

  // Makes rows [p0, min(p0 + kPanel, len)) available through row(); p0 % kPanel == 0.
  void panel(int p0) {
    p0_ = p0;
    const int p1 = std::min(len_, p0 + kPanel);
#ifdef KVS_GRAM_AVX2
    if (simd_) {
      const int iend = (p1 + 1) / 2 * 2;
      g_.resize(static_cast<size_t>(kPanel) * ld_);
      if (wide_)
        gram_lower_avx512(x_.data(), p0, iend, dimp_, ld_, g_.data());
      else
        gram_lower_avx2(x_.data(), p0, iend, dimp_, ld_, g_.data());
      return;
    }
#endif
    if (p0 == 0 && p1 == len_) {
      // The whole block is one panel: a symmetric rank update fills only the lower triangle.
      gm_.setZero(len_, len_);
      gm_.selfadjointView<Eigen::Lower>().rankUpdate(xd_);
    } else {
      gm_.noalias() = xd_.middleRows(p0, p1 - p0) * xd_.topRows(p1).transpose();
    }
    g_.assign(gm_.data(), gm_.data() + gm_.size());
    ld_ = p1;
  }
  // <x_i, x_j> for j < i, i in the current panel.
  const double* row(int i) const {
    return g_.data() + static_cast<size_t>(i - p0_) * ld_;
  }

 private:
  int len_ = 0, ld_ = 0, p0_ = 0, dimp_ = 0;
  bool simd_ = false, wide_ = false;
  std::vector<double> x_, g_;
  MatrixD xd_, gm_;
};

// ---- Prefetching the next block. run_balance_walks walks each block as soon as it has prepared
// it; preparing reads the block's key and value rows from the head (gathered through the round's
// token order), and those reads used to wait on memory. While one block is walked its Grams keep
// the core busy, so the rows of the block prepared next are prefetched then, a line or two after
// each Gram tile. Only a hint: no result depends on it.
using walk_prefetch::NextRows;
// Set by walk_prefetch::Hint around each one-block walk on this thread; null otherwise.
thread_local const NextRows* t_next_rows = nullptr;

class RowPrefetch {
 public:
  explicit RowPrefetch(const NextRows* r) : r_(r) {
    if (!r_ || r_->count <= 0) return;
    key_lines_ = (r_->d * 4 + 63) / 64;
    value_lines_ = (r_->dv * 4 + 63) / 64;
    total_ = static_cast<long>(r_->count) * (key_lines_ + value_lines_);
  }
  long total() const { return total_; }
  // Issues the next `lines` prefetches (fewer at the end).
  void issue(long lines) { upto(issued_ + lines); }
  // The Gram kernel's per-tile hook (engine/simd.h walk_gram_f32): the next per_tile lines.
  void set_per_tile(int lines) { per_tile_ = lines; }
  static void after_tile(void* self) {
    auto* p = static_cast<RowPrefetch*>(self);
    p->issue(p->per_tile_);
  }
  // Issues prefetches until `target` of total() lines have been requested.
  void upto(long target) {
    target = std::min(target, total_);
    if (issued_ >= target) return;
    // The position in locals: stores to the members inside the loop cost as much as the
    // prefetches (the compiler cannot keep them in registers across the token loads).
    int row = row_, line = line_;
    const int lines = key_lines_ + value_lines_;
    for (long k = issued_; k < target; ++k) {
      const long tok = r_->tokens[row];
      const float* addr =
          line < key_lines_
              ? r_->keys + tok * r_->d + std::min(line * 16, r_->d - 1)
              : r_->values + tok * r_->dv + std::min((line - key_lines_) * 16, r_->dv - 1);
      __builtin_prefetch(addr, 0,
                         1);  // to L2 (not L1, where the Gram tiles work): measured ~2% faster
      if (++line == lines) line = 0, ++row;
    }
    issued_ = target, row_ = row, line_ = line;
  }

 private:
  const NextRows* r_;
  int key_lines_ = 0, value_lines_ = 0, row_ = 0, line_ = 0, per_tile_ = 0;
  long total_ = 0, issued_ = 0;
};

// ---- The float32 walk (the authors' semantics, WalkBatch::float32).
//
// The block's kernel matrix is computed in float32 as torch computes it in the authors'
// balanced_walk: Gram products accumulated in float (here fused, in feature order; torch uses
// sgemm, so the two agree to float rounding), exponent ((temp * g) / sqrt(d)) - beta, value term
// ((gv + 1e-8) + 0.025). Overflow is kept as IEEE inf: the authors' partial sum runs over the
// whole block row with sigma_j = 0 for j >= i, so one non-finite K_ij anywhere in row i (inf * 0
// is NaN) makes p_i NaN and the sign -1. `tail_bad[i]` records exactly that. The sign loop is a
// float dot product of row i's lower part with the signs so far.

#if defined(KVS_GRAM_AVX2)
// The block's Gram matrices come from the SIMD table's walk_gram_f32 (engine/simd.h): those of
// CUDA's gram_tile (kernels/walk.cu) bit for bit, each entry summed by one fused multiply-add per
// feature in order. (torch's sgemm sums in its own order; the golden cases do not depend on
// which.) That order is also the fast one on a CPU: the kernel is an outer product, 8 or 16
// entries per vector, so no entry needs a horizontal sum, and AVX-512 only widens it.

// The 8 x 8 transpose of rows a[0..7] (8 floats each): out[k] = column k.
__attribute__((target("avx2,fma"))) inline void transpose8(const __m256* a, __m256* out) {
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

// Packs `len` rows of x (row-major, `dim` wide) as walk_gram_f32 reads them (engine/simd.h):
// panel t holds rows 16t .. 16t + 15 feature by feature, x[16t + r][c] at
// out[(t * dim + c) * 16 + r]; rows past the last repeat it (the entries they give lie beyond the
// block and are never read). Both 8-row halves of a panel are transposed together, so each
// feature's 64 bytes are written whole.
__attribute__((target("avx2,fma"))) void pack_panels16_avx2(const float* x, int len, int dim,
                                                            float* out) {
  const int last = len - 1;
  for (int r0 = 0; r0 < len; r0 += 16, out += static_cast<long>(dim) * 16) {
    const float* row[16];
    for (int r = 0; r < 16; ++r) row[r] = x + static_cast<long>(std::min(r0 + r, last)) * dim;
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

// exp(x) for 8 floats: x = n ln2 + r, |r| <= ln2/2, 2^n times a degree-6 polynomial in r (within
// 2 ulp of the correctly rounded value); inf above the float range (as std::exp gives), 0 below
// it (std::exp would give a denormal there; a kernel entry below 1e-38 changes no sign), NaN
// passes through.
__attribute__((target("avx2,fma"))) inline __m256 exp_f32_avx2(__m256 x) {
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
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), over);
  y = _mm256_andnot_ps(under, y);
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// K_ij of the rows [r0, r1) of one group of 8 (rows 8m .. 8m + 7 all need j < 8m + 8: `nvec`
// = m + 1 vectors, the Gram rows holding real products up to there), row r of the Grams at
// gk/gv + (r - g0) * ld and of the output at out + r * ld. Vector by vector across the group's
// rows, so the exp chains of 8 rows overlap; flags tail_bad[j] for a non-finite K_rj with j <= r.
__attribute__((target("avx2,fma"))) void kernel_rows_f32_avx2(const float* gk, const float* gv,
                                                              int g0, float* out, int ld, int r0,
                                                              int r1, int nvec, float temp,
                                                              float sqrt_d, float beta, float eps,
                                                              float bias, char* tail_bad) {
  const __m256 vt = _mm256_set1_ps(temp), vs = _mm256_set1_ps(sqrt_d), vb = _mm256_set1_ps(beta);
  const __m256 ve = _mm256_set1_ps(eps), vbias = _mm256_set1_ps(bias);
  const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 any_bad = _mm256_setzero_ps();
  for (int v = 0; v < nvec; ++v) {
    const long j = 8L * v;
    for (int r = r0; r < r1; ++r) {
      const long at = static_cast<long>(r - g0) * ld + j;
      const __m256 arg =
          _mm256_sub_ps(_mm256_div_ps(_mm256_mul_ps(vt, _mm256_loadu_ps(gk + at)), vs), vb);
      const __m256 vterm = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(gv + at), ve), vbias);
      const __m256 k = _mm256_mul_ps(exp_f32_avx2(arg), vterm);
      _mm256_storeu_ps(out + static_cast<long>(r) * ld + j, k);
      // Not finite: |k| above the largest float (inf), or NaN (unordered).
      any_bad = _mm256_or_ps(any_bad, _mm256_cmp_ps(_mm256_and_ps(k, abs_mask), big, _CMP_NLE_UQ));
    }
  }
  // Rare (an overflowing kernel entry): find which entries.
  if (_mm256_movemask_ps(any_bad))
    for (int r = r0; r < r1; ++r)
      for (int l = 0; l <= r; ++l)
        if (!std::isfinite(out[static_cast<long>(r) * ld + l])) tail_bad[l] = 1;
}

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*, which -Wmaybe-uninitialized flags.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// exp_f32_avx2 on 16 floats: the same operations in the same order, so every lane's bits are
// those of the 8-lane version (AVX512F only; masks take the place of the compare vectors).
__attribute__((target("avx512f"))) inline __m512 exp_f32_avx512(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.72283935546875f), lo = _mm512_set1_ps(-87.33654022216797f);
  const __mmask16 over = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(_mm512_min_ps(x, hi), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512 s1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_blend_ps(over, y, _mm512_set1_ps(INFINITY));
  y = _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), y);  // +0 below the range
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

// kernel_rows_f32_avx2 for one group of 16 rows (rows 16m .. 16m + 15 all need j < 16m + 16:
// `nvec` = m + 1 vectors of 16), with exp_f32_avx512: the same bits, half the instructions.
__attribute__((target("avx512f"))) void kernel_rows_f32_avx512(const float* gk, const float* gv,
                                                               int g0, float* out, int ld, int r0,
                                                               int r1, int nvec, float temp,
                                                               float sqrt_d, float beta, float eps,
                                                               float bias, char* tail_bad) {
  const __m512 vt = _mm512_set1_ps(temp), vs = _mm512_set1_ps(sqrt_d), vb = _mm512_set1_ps(beta);
  const __m512 ve = _mm512_set1_ps(eps), vbias = _mm512_set1_ps(bias);
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  __mmask16 any_bad = 0;
  for (int v = 0; v < nvec; ++v) {
    const long j = 16L * v;
    for (int r = r0; r < r1; ++r) {
      const long at = static_cast<long>(r - g0) * ld + j;
      const __m512 arg =
          _mm512_sub_ps(_mm512_div_ps(_mm512_mul_ps(vt, _mm512_loadu_ps(gk + at)), vs), vb);
      const __m512 vterm = _mm512_add_ps(_mm512_add_ps(_mm512_loadu_ps(gv + at), ve), vbias);
      const __m512 k = _mm512_mul_ps(exp_f32_avx512(arg), vterm);
      _mm512_storeu_ps(out + static_cast<long>(r) * ld + j, k);
      any_bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(k), big, _CMP_NLE_UQ);
    }
  }
  if (any_bad)
    for (int r = r0; r < r1; ++r)
      for (int l = 0; l <= r; ++l)
        if (!std::isfinite(out[static_cast<long>(r) * ld + l])) tail_bad[l] = 1;
}
#pragma GCC diagnostic pop

// sum_{j<i} k[j] * s[j] in float, 8 lanes.
__attribute__((target("avx2,fma"))) float dot_f32_avx2(const float* k, const float* s, int i) {
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
#endif

// The Gram rows of the kernel's order (one sum per entry, c = 0, 1, ... in order) with separate
// multiplies and adds: a rounding apart from the fused path, for CPUs without AVX2 and FMA.
void gram_lower_f32_portable(const float* x, int dim, int ibegin, int iend, int ldg, float* g) {
  for (int i = ibegin; i < iend; ++i) {
    const float* xi = x + static_cast<long>(i) * dim;
    for (int j = 0; j <= i; ++j) {
      const float* xj = x + static_cast<long>(j) * dim;
      float acc = 0;
      for (int c = 0; c < dim; ++c) acc += xi[c] * xj[c];
      g[static_cast<long>(i - ibegin) * ldg + j] = acc;
    }
  }
}

float dot_f32_portable(const float* k, const float* s, int i) {
  float acc = 0;
  for (int j = 0; j < i; ++j) acc += k[j] * s[j];
  return acc;
}

// ---- What both walks share: the block's place in the batch, and one step of the walk.
struct BlockRef {
  int r0 = 0, len = 0;        // rows [r0, r0 + len) of the batch
  uint32_t head = 0, id = 0;  // the block's RNG key
};

// The block's uniforms u_1 .. u_{len-1} (u_0 is never drawn; u[0] is unused), drawn before the
// walk: the draws do not depend on the signs, so they run back to back instead of adding the
// generator's latency to every sequential step.
void draw_uniforms(const WalkBatch& b, const BlockRef& blk, std::vector<double>& u) {
  u.resize(blk.len);
  u[0] = 0;
  for (int i = 1; i < blk.len; ++i)
    u[i] = counter_uniform(b.seed, kRandWalk, b.layer, blk.head, b.round, blk.id,
                           static_cast<uint32_t>(i));
}

// Step i of a block: sigma_0 = +1; otherwise +1 when the step's uniform u, in the walk's
// precision T, is below p, and -1 when not or when p is NaN (so p outside [0, 1] forces the
// sign: the double walk's clip to [0, 1] compares the same, as u is in [0, 1)). Records the
// sign, p and the partial sum; returns the sign.
template <typename T>
int8_t walk_step(const WalkBatch& b, const BlockRef& blk, int i, double u, T p, T partial) {
  const int8_t s = i == 0 || static_cast<T>(u) < p ? int8_t{+1} : int8_t{-1};
  b.sigma[blk.r0 + i] = s;
  if (b.p) b.p[blk.r0 + i] = static_cast<float>(p);
  if (b.partial) b.partial[blk.r0 + i] = static_cast<float>(partial);
  return s;
}

// ---- The float32 walk's block.
struct F32Block {
  std::vector<float> pk, pv, gk, gv, kern, sig;
  std::vector<char> tail_bad;
  std::vector<double> u;
};

void walk_block_f32(const WalkBatch& b, const BlockRef& blk, F32Block& w) {
  const int len = blk.len;
  const float* xk = b.keys + static_cast<long>(blk.r0) * b.d;
  const float* xv = b.values + static_cast<long>(blk.r0) * b.dv;
  const int ld = (len + 15) / 16 * 16;  // walk_gram_f32 writes columns up to len rounded to 16
  // Row i of `kern` holds K_ij for j <= i (and, on the SIMD path, up to i rounded up to 8, never
  // read).
  if (w.kern.size() < static_cast<size_t>(len) * ld) w.kern.resize(static_cast<size_t>(len) * ld);
  w.tail_bad.assign(len, 0);
  // Gram rows are computed a panel at a time, so memory stays panel x L for long blocks.
  // 64 rows: the two Grams' panels take 64 KiB at B = 128, so they, the packed rows and the
  // kernel rows stay within a 512 KiB L2 cache.
  constexpr int kPanel = 64;
  w.gk.resize(static_cast<size_t>(kPanel) * ld);
  w.gv.resize(static_cast<size_t>(kPanel) * ld);
  // The fused Gram of the SIMD table in use (KVSCOPE_SIMD=sse2 or set_cpu_walk_simd(false):
  // the portable one, a rounding apart).
  const auto gram = simd::kernels().walk_gram_f32;
#if defined(KVS_GRAM_AVX2)
  const bool simd = g_walk_simd.load(std::memory_order_relaxed) && gram && cpu_has_avx2_fma();
  // With the AVX-512 table, the kernel rows 16 wide too (the same bits; KVSCOPE_SIMD=avx2 gives
  // the 8-wide ones).
  const bool wide_rows = simd && std::strcmp(simd::kernels().name, "avx512") == 0;
#else
  const bool simd = false;
#endif
  const float temp = static_cast<float>(b.temp);
  const float sqrt_d = static_cast<float>(std::sqrt(static_cast<double>(b.d)));
  const float beta = static_cast<float>(b.beta);
  const float eps = static_cast<float>(b.value_eps);
  const float bias = static_cast<float>(b.value_bias);
  // The next block's rows are prefetched in step with the Grams' tiles, a line or two per tile.
  RowPrefetch prefetch(t_next_rows);
  // Tiles per Gram as the AVX2 kernel walks them (a short first band, then bands of 6 rows, each
  // in tiles of up to 16 columns through its last row); the AVX-512 kernel's fewer, wider tiles
  // leave the rest of the prefetches to the end of the block.
  long tiles = 0;
  for (int i0 = 0, band = len % 6 ? len % 6 : 6; i0 < len; i0 += band, band = 6)
    tiles += ((std::min(i0 + band, len) + 7) / 8 * 8 + 15) / 16;
  prefetch.set_per_tile(static_cast<int>((prefetch.total() + 2 * tiles - 1) / (2 * tiles)));
#if defined(KVS_GRAM_AVX2)
  if (simd) {
    const size_t packed = static_cast<size_t>((len + 15) / 16) * 16;
    w.pk.resize(packed * b.d);
    w.pv.resize(packed * b.dv);
    pack_panels16_avx2(xk, len, b.d, w.pk.data());
    pack_panels16_avx2(xv, len, b.dv, w.pv.data());
  }
#endif
  for (int p0 = 0; p0 < len; p0 += kPanel) {
    const int p1 = std::min(len, p0 + kPanel);
#if defined(KVS_GRAM_AVX2)
    if (simd) {
      gram(w.pk.data(), len, b.d, p0, p1, ld, w.gk.data(), RowPrefetch::after_tile, &prefetch);
      gram(w.pv.data(), len, b.dv, p0, p1, ld, w.gv.data(), RowPrefetch::after_tile, &prefetch);
    }
#endif
    if (!simd) {
      gram_lower_f32_portable(xk, b.d, p0, p1, ld, w.gk.data());
      gram_lower_f32_portable(xv, b.dv, p0, p1, ld, w.gv.data());
    }
#if defined(KVS_GRAM_AVX2)
    if (wide_rows) {
      for (int r0 = p0; r0 < p1; r0 = (r0 / 16 + 1) * 16)
        kernel_rows_f32_avx512(w.gk.data(), w.gv.data(), p0, w.kern.data(), ld, r0,
                               std::min(p1, (r0 / 16 + 1) * 16), r0 / 16 + 1, temp, sqrt_d, beta,
                               eps, bias, w.tail_bad.data());
      continue;
    }
    if (simd) {
      for (int r0 = p0; r0 < p1; r0 = (r0 / 8 + 1) * 8)
        kernel_rows_f32_avx2(w.gk.data(), w.gv.data(), p0, w.kern.data(), ld, r0,
                             std::min(p1, (r0 / 8 + 1) * 8), r0 / 8 + 1, temp, sqrt_d, beta, eps,
                             bias, w.tail_bad.data());
      continue;
    }
#endif
    for (int i = p0; i < p1; ++i) {
      const float* gki = w.gk.data() + static_cast<size_t>(i - p0) * ld;
      const float* gvi = w.gv.data() + static_cast<size_t>(i - p0) * ld;
      float* ki = w.kern.data() + static_cast<size_t>(i) * ld;
      for (int j = 0; j <= i; ++j) {
        const float arg = (temp * gki[j]) / sqrt_d - beta;
        ki[j] = std::exp(arg) * ((gvi[j] + eps) + bias);
        // Row i's sum sees K_ij for j >= i through sigma_j = 0: the diagonal here, and K_ji
        // (the same matrix entry) of the later rows.
        if (!std::isfinite(ki[j])) w.tail_bad[j] = 1;
      }
    }
  }
  prefetch.upto(prefetch.total());
  w.sig.assign(ld, 0.0f);
  draw_uniforms(b, blk, w.u);
  const float gamma = static_cast<float>(b.gamma);
  for (int i = 0; i < len; ++i) {
    const float* ki = w.kern.data() + static_cast<size_t>(i) * ld;
#if defined(KVS_GRAM_AVX2)
    float partial =
        simd ? dot_f32_avx2(ki, w.sig.data(), i) : dot_f32_portable(ki, w.sig.data(), i);
#else
    float partial = dot_f32_portable(ki, w.sig.data(), i);
#endif
    if (w.tail_bad[i]) partial = std::numeric_limits<float>::quiet_NaN();
    w.sig[i] = walk_step<float>(b, blk, i, w.u[i], 0.5f - gamma * partial, partial);
  }
}

// ---- The double walk's block (preset kvscope-v1): Grams in double, K_ij recomputed per row.
struct F64Block {
  BlockGram gk, gv;
  std::vector<double> sig, u;
};

void walk_block_f64(const WalkBatch& b, const BlockRef& blk, F64Block& w) {
  const double scale = b.temp / std::sqrt(static_cast<double>(b.d));
  w.gk.load(b.keys + static_cast<long>(blk.r0) * b.d, blk.len, b.d);
  w.gv.load(b.values + static_cast<long>(blk.r0) * b.dv, blk.len, b.dv);
  w.sig.assign(blk.len, 0.0);
  draw_uniforms(b, blk, w.u);
  for (int i = 0; i < blk.len; ++i) {
    if (i % BlockGram::kPanel == 0) {
      w.gk.panel(i);
      w.gv.panel(i);
    }
    double partial = 0;
    const double* gki = w.gk.row(i);
    const double* gvi = w.gv.row(i);
    for (int j = 0; j < i; ++j)
      partial += std::exp(scale * gki[j] - b.beta) * (gvi[j] + b.value_bias) * w.sig[j];
    w.sig[i] = walk_step<double>(b, blk, i, w.u[i], 0.5 - b.gamma * partial, partial);
  }
}

}  // namespace

walk_prefetch::Hint::Hint(const NextRows* rows) {
  t_next_rows = rows;
}
walk_prefetch::Hint::~Hint() {
  t_next_rows = nullptr;
}

bool set_cpu_walk_simd(bool enabled) {
  return g_walk_simd.exchange(enabled);
}

void cpu_walk_gram_f32(const float* x, int rows, int dim, float* g, int ldg) {
  if (rows <= 0) return;
  if (dim <= 0 || ldg < rows) throw std::invalid_argument("cpu_walk_gram_f32: bad dim or ldg");
#if defined(KVS_GRAM_AVX2)
  const auto gram = simd::kernels().walk_gram_f32;
  if (g_walk_simd.load(std::memory_order_relaxed) && gram && cpu_has_avx2_fma()) {
    const int ld = (rows + 15) / 16 * 16;
    std::vector<float> packed(static_cast<size_t>(ld) * dim);
    std::vector<float> full(static_cast<size_t>(rows) * ld);
    pack_panels16_avx2(x, rows, dim, packed.data());
    gram(packed.data(), rows, dim, 0, rows, ld, full.data(), nullptr, nullptr);
    for (int i = 0; i < rows; ++i)
      std::copy_n(full.data() + static_cast<size_t>(i) * ld, i + 1, g + static_cast<long>(i) * ldg);
    return;
  }
#endif
  gram_lower_f32_portable(x, dim, 0, rows, ldg, g);
}

void cpu_walk_blocks(const WalkBatch& b) {
  if (b.num_blocks <= 0) return;
  if (!b.keys || !b.values || !b.block_offset || !b.block_head || !b.block_id || !b.sigma)
    throw std::invalid_argument("cpu_walk_blocks: missing input or output array");
  if (b.d <= 0 || b.dv <= 0) throw std::invalid_argument("cpu_walk_blocks: d and dv must be > 0");
  thread_local F32Block f32;
  thread_local F64Block f64;
  for (int i = 0; i < b.num_blocks; ++i) {
    const BlockRef blk{b.block_offset[i], b.block_offset[i + 1] - b.block_offset[i],
                       b.block_head[i], b.block_id[i]};
    if (blk.len <= 0) continue;
    if (b.float32)
      walk_block_f32(b, blk, f32);
    else
      walk_block_f64(b, blk, f64);
  }
  if (f32.kern.capacity() > (size_t{16} << 20)) f32 = F32Block();
}

}  // namespace kvscope
