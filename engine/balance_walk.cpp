#include "engine/balance_walk.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <thread>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "engine/backend.h"
#include "engine/capture.h"
#include "engine/cpu_ops.h"
#include "engine/error.h"
#include "engine/protocol.h"
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

bool cpu_has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
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
struct NextRows {
  const float* keys = nullptr;    // the head's rows, d wide
  const float* values = nullptr;  // dv wide
  int d = 0, dv = 0;
  const int* tokens = nullptr;  // rows of the next block
  int count = 0;
};
// Set by run_balance_walks around each one-block walk on this thread; null otherwise.
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

// ---------------------------------------------------------------------------------------------
// Parameters.

std::vector<ParamSpec> balancekv_param_specs() {
  std::vector<ParamSpec> s;
  s.push_back({"gamma",
               ParamSpec::Type::Float,
               0,
               100,
               4,
               "walk strength: p_i = 1/2 - gamma * sum_{j<i} K_ij sigma_j; 0 draws fair coins with "
               "the same halving (not the authors' notebook ablation, an older walk)",
               {},
               false});
  s.push_back({"temp",
               ParamSpec::Type::Float,
               0,
               10,
               1,
               "kernel temperature: exp(temp <k_i,k_j>/sqrt d - beta); on the sample captures "
               "98-100% of steps saturate (p outside (0,1)) at 1, still 93-99% at the authors' "
               "notebook value 0.1",
               {},
               false});
  s.push_back({"beta", ParamSpec::Type::Float, -50, 50, 0, "kernel log-offset beta", {}, false});
  s.push_back({"value_bias",
               ParamSpec::Type::Float,
               0,
               10,
               0.025,
               "added to <v_i,v_j> in the kernel (float32 also adds the authors' 1e-8)",
               {},
               false});
  s.push_back({"block", ParamSpec::Type::Int, 2, 4096, 128, "walk block length B", {}, true});
  s.push_back({"protect_anticorrelated",
               ParamSpec::Type::Bool,
               0,
               1,
               0,
               "needle variant: keep keys whose mean inner product with their block is <= 0 "
               "(and +-25 neighbours) at weight 1, outside the walk; at most half the budget",
               {},
               false});
  s.push_back({"halving",
               ParamSpec::Type::Choice,
               0,
               1,
               0,
               "authors: c = max(first index where the -1 count reaches n//2, same for +1), weight "
               "2 up to c for the sign not at c, 1 after c, first n//2 by stable weight order "
               "(the last token of an odd round is dropped); balanced: KVScope's earlier rule, "
               "the first sign drawn n - keep times is dropped up to that point",
               {"authors", "balanced"},
               false});
  s.push_back({"centring",
               ParamSpec::Type::Choice,
               0,
               1,
               0,
               "padded-block: zero-pad the round to a multiple of B and centre each block by its "
               "mean over all B rows, padding included (the authors); real-rows: last block "
               "shorter, mean over its real rows (KVScope's earlier variant)",
               {"padded-block", "real-rows"},
               false});
  s.push_back({"precision",
               ParamSpec::Type::Choice,
               0,
               1,
               0,
               "float32: the authors' float32 kernel, where exp overflows the step's p is NaN or "
               "-inf and the sign -1; double: KVScope's earlier double kernel with p clipped to "
               "[0, 1] (never overflows)",
               {"float32", "double"},
               false});
  s.push_back({"kept",
               ParamSpec::Type::Choice,
               0,
               1,
               0,
               "floor-halving: floor(n/2) of each round's tokens, log2(1/ratio) rounds, at most "
               "the budget (the authors); budget: round(n/2^r) per round, exactly the budget "
               "(KVScope's earlier variant)",
               {"floor-halving", "budget"},
               false});
  s.push_back({"preset",
               ParamSpec::Type::Choice,
               0,
               1,
               0,
               "custom: the four switches above as set; kvscope-v1: KVScope's earlier variant "
               "(halving balanced, centring real-rows, precision double, kept budget), overriding "
               "the four switches, so earlier numbers stay reproducible",
               {"custom", "kvscope-v1"},
               false});
  return s;
}

BalanceParams kvscope_v1_params(BalanceParams p) {
  p.halving = HalvingRule::Balanced;
  p.centring = Centring::RealRows;
  p.float32 = false;
  p.kept = KeptCount::Budget;
  return p;
}

BalanceParams balance_params_from(const ParamValues& values) {
  const std::vector<ParamSpec> specs = balancekv_param_specs();
  for (const auto& [name, v] : values) {
    const ParamSpec& spec = find_param_spec(specs, name, "balancekv");
    const double hi = spec.type == ParamSpec::Type::Choice
                          ? static_cast<double>(spec.choices.size()) - 1
                          : spec.max;
    if (!std::isfinite(v) || v < spec.min || v > hi) {
      std::ostringstream os;
      os << "balancekv: parameter " << name << " = " << v << " is outside [" << spec.min << ", "
         << hi << "]";
      throw InputError(os.str());
    }
    if (spec.type != ParamSpec::Type::Float && v != std::floor(v)) {
      std::ostringstream os;
      os << "balancekv: parameter " << name << " = " << v << " must be an integer";
      throw InputError(os.str());
    }
  }
  BalanceParams p;
  p.gamma = param_value(specs, values, "gamma");
  p.temp = param_value(specs, values, "temp");
  p.beta = param_value(specs, values, "beta");
  p.value_bias = param_value(specs, values, "value_bias");
  p.block = static_cast<int>(param_value(specs, values, "block"));
  p.protect_anticorrelated = param_value(specs, values, "protect_anticorrelated") != 0;
  p.halving =
      param_value(specs, values, "halving") != 0 ? HalvingRule::Balanced : HalvingRule::Authors;
  p.centring =
      param_value(specs, values, "centring") != 0 ? Centring::RealRows : Centring::PaddedBlock;
  p.float32 = param_value(specs, values, "precision") == 0;
  p.kept = param_value(specs, values, "kept") != 0 ? KeptCount::Budget : KeptCount::FloorHalving;
  if (param_value(specs, values, "preset") == 1) p = kvscope_v1_params(p);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Halving.

Halving exact_halving(const std::vector<int8_t>& sigma, int keep) {
  const int n = static_cast<int>(sigma.size());
  if (n < 2 || (keep != n / 2 && keep != (n + 1) / 2))
    throw std::invalid_argument("exact_halving: keep must be floor(n/2) or ceil(n/2), n >= 2");
  const int quota = n - keep;  // how many the majority sign gives up
  Halving h;
  int plus = 0, minus = 0;
  for (int i = 0; i < n; ++i) {
    (sigma[i] > 0 ? plus : minus)++;
    if (plus == quota || minus == quota) {
      h.cut = i;
      h.majority_sign = plus == quota ? +1 : -1;
      break;
    }
  }
  // A sign always reaches the quota: quota <= ceil(n/2) <= max(plus, minus) at the end.
  h.kept.reserve(keep);
  h.factor.reserve(keep);
  for (int i = 0; i <= h.cut; ++i)
    if (sigma[i] != h.majority_sign) {
      h.kept.push_back(i);
      h.factor.push_back(2.0);
    }
  for (int i = h.cut + 1; i < n; ++i) {
    h.kept.push_back(i);
    h.factor.push_back(1.0);
  }
  return h;
}

Halving authors_halving(const std::vector<int8_t>& sigma, int keep) {
  const int n = static_cast<int>(sigma.size());
  if (keep < 0 || keep > (n + 1) / 2)
    throw std::invalid_argument("authors_halving: keep must be in [0, ceil(n/2)]");
  Halving h;
  if (n == 0) return h;
  // argmax of (running count == n//2): the first index where it holds, 0 when it never does.
  const int half = n / 2;
  int neg = 0, pos = 0, c_neg = -1, c_pos = -1;
  for (int i = 0; i < n; ++i) {
    (sigma[i] > 0 ? pos : neg)++;
    if (c_neg < 0 && neg == half) c_neg = i;
    if (c_pos < 0 && pos == half) c_pos = i;
  }
  const int c = std::max(std::max(c_neg, 0), std::max(c_pos, 0));
  h.cut = c;
  // Weight 2 * sigma_i up to c, negated when sigma_c = +1: the sign at c is dropped up to c.
  h.majority_sign = sigma[c] > 0 ? +1 : -1;
  // Stable descending order of the weights {2, 1, -2}: the 2s (all <= c) in order, then the 1s
  // (all > c) in order, then the -2s. The first `keep` survive; since there are ceil(n/2) 2s and
  // 1s together, no -2 survives and the survivors stay in walk order.
  for (int i = 0; i <= c && static_cast<int>(h.kept.size()) < keep; ++i)
    if (sigma[i] != h.majority_sign) {
      h.kept.push_back(i);
      h.factor.push_back(2.0);
    }
  for (int i = c + 1; i < n && static_cast<int>(h.kept.size()) < keep; ++i) {
    h.kept.push_back(i);
    h.factor.push_back(1.0);
  }
  if (static_cast<int>(h.kept.size()) != keep)
    throw std::logic_error("authors_halving: fewer than keep positions of weight 2 or 1");
  return h;
}

std::vector<int> floor_halving_schedule(int n0, int target) {
  std::vector<int> s;
  if (target <= 0 || target >= n0) return s;
  for (int size = n0 / 2;; size /= 2) {
    s.push_back(size);
    if (size <= target) break;
  }
  return s;
}

std::vector<int> halving_schedule(int n0, int target) {
  std::vector<int> s;
  if (target <= 0 || target >= n0) return s;
  for (int r = 1; r < 63; ++r) {
    const int size = static_cast<int>(std::floor(std::ldexp(static_cast<double>(n0), -r) + 0.5));
    s.push_back(size);
    if (size <= target) break;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Needle variant.

std::vector<int> protected_anticorrelated(const MatrixF& keys, int mid_begin, int mid_end,
                                          int block, int cap) {
  std::vector<int> out;
  if (cap <= 0 || mid_end <= mid_begin) return out;
  struct Flag {
    double score;
    int token;
  };
  std::vector<Flag> flagged;
  for (int b0 = mid_begin; b0 < mid_end; b0 += block) {
    const int b1 = std::min(mid_end, b0 + block);
    // mean_j <k_i, k_j> over the block (j = i included) is <k_i, mean of the block>.
    VectorD mean = keys.middleRows(b0, b1 - b0).cast<double>().colwise().mean().transpose();
    for (int i = b0; i < b1; ++i) {
      const double score = keys.row(i).cast<double>().dot(mean.transpose());
      if (score <= 0) flagged.push_back({score, i});
    }
  }
  std::stable_sort(flagged.begin(), flagged.end(),
                   [](const Flag& a, const Flag& b) { return a.score < b.score; });
  std::vector<char> taken(mid_end - mid_begin, 0);
  int count = 0;
  for (const Flag& f : flagged) {
    for (int off = 0; off <= kProtectDilation && count < cap; ++off) {
      for (int t : {f.token - off, f.token + off}) {
        if (t < mid_begin || t >= mid_end || taken[t - mid_begin] || count >= cap) continue;
        taken[t - mid_begin] = 1;
        ++count;
        if (off == 0) break;  // f.token - 0 == f.token + 0
      }
    }
    if (count >= cap) break;
  }
  for (int i = 0; i < mid_end - mid_begin; ++i)
    if (taken[i]) out.push_back(mid_begin + i);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Traces.

void fill_block_trace(WalkBlockTrace& t, const MatrixD& kernel, const MatrixD& query_terms,
                      uint64_t seed, uint32_t layer, uint32_t head, uint32_t round,
                      uint32_t block) {
  const int len = static_cast<int>(t.sigma.size());
  const int dv = static_cast<int>(query_terms.cols());
  t.disc_query.assign(len, 0);
  t.disc_kernel.assign(len, 0);
  t.random_disc_query.assign(len, 0);
  t.random_disc_kernel.assign(len, 0);
  t.path.assign(len, {0, 0});
  t.random_path.assign(len, {0, 0});
  if (len == 0) return;

  std::vector<int> rnd(len);
  for (int i = 0; i < len; ++i)
    rnd[i] = counter_uniform(seed, kRandRandomSigns, layer, head, round, block,
                             static_cast<uint32_t>(i)) < 0.5
                 ? +1
                 : -1;

  // Kernel-PCA coordinates. With H = I - 11^T/L and HKH alpha_a = lambda_a alpha_a (unit
  // alpha_a, so sum(alpha_a) = 0 for lambda_a > 0), the a-th principal direction in feature space
  // is u_a = sum_j alpha_aj (phi_j - mean phi) / sqrt(lambda_a). For one element,
  // <phi_l, u_a> = sum_j alpha_aj (K_lj - mean_m K_lm) / sqrt(lambda_a) = (K alpha_a)_l /
  // sqrt(lambda_a) because sum_j alpha_aj = 0. The prefix signed sum sum_{l<=i} sigma_l phi_l
  // therefore projects to sum_{l<=i} sigma_l (K alpha_a)_l / sqrt(lambda_a).
  MatrixD coord = MatrixD::Zero(len, 2);
  if (len >= 2) {
    Eigen::MatrixXd centred = kernel;
    const Eigen::VectorXd row_mean = centred.rowwise().mean();
    const Eigen::RowVectorXd col_mean = centred.colwise().mean();
    const double all_mean = centred.mean();
    centred.colwise() -= row_mean;
    centred.rowwise() -= col_mean;
    centred.array() += all_mean;
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(centred);
    if (eig.info() == Eigen::Success) {
      const double floor_eig = 1e-12 * std::max(1.0, std::abs(centred.trace()));
      for (int a = 0; a < 2; ++a) {
        const int idx = len - 1 - a;  // eigenvalues ascend
        const double lambda = eig.eigenvalues()(idx);
        if (idx < 0 || !(lambda > floor_eig)) continue;
        Eigen::VectorXd alpha = eig.eigenvectors().col(idx);
        Eigen::Index big = 0;
        alpha.cwiseAbs().maxCoeff(&big);
        if (alpha(big) < 0) alpha = -alpha;  // fix the eigenvector's sign for reproducible plots
        const Eigen::VectorXd c = kernel * alpha / std::sqrt(lambda);
        for (int l = 0; l < len; ++l) coord(l, a) = c(l);
      }
    }
  }

  Eigen::VectorXd acc = Eigen::VectorXd::Zero(dv), racc = Eigen::VectorXd::Zero(dv);
  double quad = 0, rquad = 0;
  std::array<double, 2> pth{0, 0}, rpth{0, 0};
  for (int i = 0; i < len; ++i) {
    double part = 0, rpart = 0;
    for (int j = 0; j < i; ++j) {
      part += kernel(i, j) * t.sigma[j];
      rpart += kernel(i, j) * rnd[j];
    }
    // sigma^T K sigma grows by 2 sigma_i sum_{j<i} K_ij sigma_j + K_ii.
    quad += 2.0 * t.sigma[i] * part + kernel(i, i);
    rquad += 2.0 * rnd[i] * rpart + kernel(i, i);
    t.disc_kernel[i] = std::sqrt(std::max(0.0, quad));
    t.random_disc_kernel[i] = std::sqrt(std::max(0.0, rquad));
    acc += t.sigma[i] * query_terms.row(i).transpose();
    racc += rnd[i] * query_terms.row(i).transpose();
    t.disc_query[i] = acc.norm();
    t.random_disc_query[i] = racc.norm();
    for (int a = 0; a < 2; ++a) {
      pth[a] += t.sigma[i] * coord(i, a);
      rpth[a] += rnd[i] * coord(i, a);
    }
    t.path[i] = pth;
    t.random_path[i] = rpth;
  }
}

std::vector<float> trace_query_vector(const MethodInput& in, int* position_out) {
  int pos = in.trace_query < 0 ? in.n - 1 : in.trace_query;
  if (pos < 0 || pos >= in.n) {
    std::ostringstream os;
    os << "trace query position " << in.trace_query << " is outside the capture's " << in.n
       << " tokens";
    throw InputError(os.str());
  }
  const MatrixF& src = in.queries.empty() || !in.queries[0] ? *in.keys : *in.queries[0];
  if (position_out) *position_out = pos;
  return std::vector<float>(src.row(pos).data(), src.row(pos).data() + src.cols());
}

namespace {

// sum[c] = the sum over the rows `tokens` (in order) of row[c], in double, as the block mean
// always summed them. The AVX2 version keeps 32 columns in 8 registers per pass over the rows:
// each column's sum is one chain of dependent adds, and 8 chains (not 4) keep both add units busy
// past the add latency.
#if defined(KVS_GRAM_AVX2)
__attribute__((target("avx2,fma"))) void column_sums_avx2(const float* rows, const int* tokens,
                                                          int count, int d, double* sum) {
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
#endif

void column_sums(const float* rows, const int* tokens, int count, int d, double* sum) {
#if defined(KVS_GRAM_AVX2)
  if (cpu_has_avx2_fma()) return column_sums_avx2(rows, tokens, count, d, sum);
#endif
  std::fill(sum, sum + d, 0.0);
  for (int i = 0; i < count; ++i) {
    const float* k = rows + static_cast<long>(tokens[i]) * d;
    for (int c = 0; c < d; ++c) sum[c] += k[c];
  }
}

// The walk's kernel for one block of prepared rows (centred keys, weighted values), full and
// symmetric, in double; used only for traces.
MatrixD block_kernel(const float* keys, const float* values, int len, int d, int dv,
                     const BalanceParams& prm) {
  const MatrixD kd = Eigen::Map<const MatrixF>(keys, len, d).cast<double>();
  const MatrixD vd = Eigen::Map<const MatrixF>(values, len, dv).cast<double>();
  const double scale = prm.temp / std::sqrt(static_cast<double>(d));
  MatrixD gk = kd * kd.transpose();
  MatrixD gv = vd * vd.transpose();
  return ((scale * gk.array() - prm.beta).exp() * (gv.array() + prm.value_bias)).matrix();
}

// The trace's query terms exp(<k_j,q>/sqrt d) w_j v_j for raw (uncentred) keys and the current
// accumulated weights, in units of the block's largest term so blocks are comparable (and
// nothing overflows): a single term has norm at most 1.
MatrixD query_terms(const WalkJob& job, const std::vector<int>& tokens, const double* weights,
                    int len) {
  const int d = static_cast<int>(job.keys->cols());
  const int dv = static_cast<int>(job.values->cols());
  Eigen::Map<const VectorF> q(job.trace_query.data(), d);
  std::vector<double> logit(len);
  double top = -INFINITY;
  for (int j = 0; j < len; ++j) {
    logit[j] = job.keys->row(tokens[j]).cast<double>().dot(q.cast<double>()) /
               std::sqrt(static_cast<double>(d));
    top = std::max(top, logit[j]);
  }
  MatrixD z(len, dv);
  double biggest = 0;
  for (int j = 0; j < len; ++j) {
    z.row(j) = std::exp(logit[j] - top) * weights[j] * job.values->row(tokens[j]).cast<double>();
    biggest = std::max(biggest, z.row(j).norm());
  }
  if (biggest > 0) z /= biggest;
  return z;
}

struct JobState {
  std::vector<int> seq;   // tokens still in play, walk order (ascending)
  std::vector<double> w;  // their accumulated weights
  std::vector<int> schedule;
  WalkOutcome out;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rounds.

std::vector<WalkOutcome> run_balance_walks(const std::vector<WalkJob>& jobs, int layer,
                                           uint64_t seed, const BalanceParams& prm,
                                           Backend* backend) {
  std::vector<JobState> st(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const WalkJob& job = jobs[j];
    if (!job.keys || !job.values) throw std::invalid_argument("run_balance_walks: no keys/values");
    st[j].seq = job.tokens;
    st[j].w.assign(job.tokens.size(), 1.0);
    st[j].schedule = prm.kept == KeptCount::FloorHalving
                         ? floor_halving_schedule(static_cast<int>(job.tokens.size()), job.target)
                         : halving_schedule(static_cast<int>(job.tokens.size()), job.target);
    if (job.target <= 0) st[j].seq.clear(), st[j].w.clear();
  }
  const int block = std::max(2, prm.block);
  const bool padded = prm.centring == Centring::PaddedBlock;

  // Prepared rows of one round, reused across rounds and calls.
  thread_local std::vector<float> keys, values, p, partial;
  thread_local std::vector<int8_t> sigma;
  thread_local std::vector<int> offset, real_rows;
  thread_local std::vector<uint32_t> head, bid;
  struct Span {
    size_t job;
    int first_block;  // index into offset/head/bid
    int num_blocks;
  };

  for (int round = 0;; ++round) {
    std::vector<Span> spans;
    offset.assign(1, 0), head.clear(), bid.clear();
    real_rows.clear();
    int d = -1, dv = -1;
    // On the CPU each block is walked as soon as it is prepared, while its rows are still in
    // cache (the results do not depend on which blocks share a call); a GPU gets the whole round
    // in one call. Without traces (which read the round's prepared rows afterwards) the CPU
    // prepares every block into the same rows, which stay in cache.
    const bool walk_each_block = !backend || !backend->is_gpu();
    bool any_trace = false;
    for (size_t j = 0; j < jobs.size(); ++j)
      if (round < static_cast<int>(st[j].schedule.size()) && !jobs[j].trace_query.empty())
        any_trace = true;
    const bool reuse_block_rows = walk_each_block && !any_trace;
    // Every row of the round is written below (padding rows too), so the buffers are sized once
    // up front and only grow: no per-block zero fill.
    {
      size_t key_floats = 0, value_floats = 0;
      long total_rows = 0;
      for (size_t j = 0; j < jobs.size(); ++j) {
        if (round >= static_cast<int>(st[j].schedule.size())) continue;
        const long n = static_cast<long>(st[j].seq.size());
        const long rows = padded ? (n + block - 1) / block * block : n;
        total_rows += rows;
        const long held = reuse_block_rows ? std::min<long>(rows, block) : rows;
        if (reuse_block_rows) {
          key_floats = std::max(key_floats, static_cast<size_t>(held) * jobs[j].keys->cols());
          value_floats = std::max(value_floats, static_cast<size_t>(held) * jobs[j].values->cols());
        } else {
          key_floats += static_cast<size_t>(held) * jobs[j].keys->cols();
          value_floats += static_cast<size_t>(held) * jobs[j].values->cols();
        }
      }
      if (keys.size() < key_floats) keys.resize(key_floats);
      if (values.size() < value_floats) values.resize(value_floats);
      sigma.assign(total_rows, 0);
      p.assign(total_rows, 0);
      partial.assign(total_rows, 0);
    }
    size_t kpos = 0, vpos = 0;
    WalkBatch batch;
    batch.seed = seed;
    batch.layer = static_cast<uint32_t>(layer);
    batch.round = static_cast<uint32_t>(round);
    batch.gamma = prm.gamma;
    batch.temp = prm.temp;
    batch.beta = prm.beta;
    batch.value_bias = prm.value_bias;
    batch.float32 = prm.float32;
    batch.value_eps = prm.float32 ? kAuthorsValueEps : 0.0;
    std::vector<double> mean;
    std::vector<float> mean_f;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (round >= static_cast<int>(st[j].schedule.size())) continue;
      const WalkJob& job = jobs[j];
      const int jd = static_cast<int>(job.keys->cols()), jdv = static_cast<int>(job.values->cols());
      if (d < 0) d = jd, dv = jdv;
      if (jd != d || jdv != dv)
        throw std::invalid_argument("run_balance_walks: jobs with different head dimensions");
      const int n = static_cast<int>(st[j].seq.size());
      Span sp{j, static_cast<int>(head.size()), 0};
      for (int b0 = 0, blk = 0; b0 < n; b0 += block, ++blk) {
        // centring = padded-block (the authors): the round is zero-padded to a multiple of B, the
        // block mean is taken over all B rows (padding included), and the padding rows (key
        // -mean, value 0) are walked after the real rows. They cannot change a real row's sign,
        // except in float32, where an overflowing K_i,pad makes row i's sum NaN, as in the
        // authors' code. centring = real-rows: the last block is shorter, mean over real rows.
        const int b1 = std::min(n, b0 + block);
        const int real = b1 - b0;
        const int rows = padded ? block : real;
        mean.resize(d);
        column_sums(job.keys->data(), st[j].seq.data() + b0, real, d, mean.data());
        for (double& m : mean) m /= rows;
        if (prm.float32) {
          // As torch: the float32 mean, subtracted in float32.
          mean_f.resize(d);
          for (int c = 0; c < d; ++c) mean_f[c] = static_cast<float>(mean[c]);
        }
        for (int i = b0; i < b0 + rows; ++i) {
          float* kd = keys.data() + kpos + static_cast<size_t>(i - b0) * d;
          float* vd = values.data() + vpos + static_cast<size_t>(i - b0) * dv;
          if (i >= b1) {  // zero padding: centred key -mean, value 0
            for (int c = 0; c < d; ++c)
              kd[c] = prm.float32 ? 0.0f - mean_f[c] : static_cast<float>(-mean[c]);
            std::fill(vd, vd + dv, 0.0f);
            continue;
          }
          const long tok = st[j].seq[i];
          const float* k = job.keys->data() + tok * d;
          const float* v = job.values->data() + tok * dv;
          if (prm.float32)
            for (int c = 0; c < d; ++c) kd[c] = k[c] - mean_f[c];
          else
            for (int c = 0; c < d; ++c) kd[c] = static_cast<float>(k[c] - mean[c]);
          const double w = st[j].w[i];
          if (w == 1.0)  // every weight of round 1: v * 1 in double, back to float, is v
            std::copy(v, v + dv, vd);
          else
            for (int c = 0; c < dv; ++c) vd[c] = static_cast<float>(v[c] * w);
        }
        if (walk_each_block) {
          const int row0 = offset.back();
          const int one_offset[2] = {0, rows};
          const uint32_t one_head = static_cast<uint32_t>(job.kv_head);
          const uint32_t one_id = static_cast<uint32_t>(blk);
          WalkBatch one = batch;
          one.d = d;
          one.dv = dv;
          one.num_blocks = 1;
          one.keys = keys.data() + kpos;
          one.values = values.data() + vpos;
          one.block_offset = one_offset;
          one.block_head = &one_head;
          one.block_id = &one_id;
          one.sigma = sigma.data() + row0;
          one.p = p.data() + row0;
          one.partial = partial.data() + row0;
          // The next block of this job (the first block of the next job is not prefetched).
          NextRows next;
          next.keys = job.keys->data();
          next.values = job.values->data();
          next.d = d;
          next.dv = dv;
          next.tokens = st[j].seq.data() + std::min(n, b0 + block);
          next.count = std::min(n, b0 + 2 * block) - std::min(n, b0 + block);
          struct Hint {  // cleared however the walk returns
            explicit Hint(const NextRows* r) { t_next_rows = r; }
            ~Hint() { t_next_rows = nullptr; }
          } hint(&next);
          if (backend)
            backend->walk_blocks(one);
          else
            cpu_walk_blocks(one);
        }
        if (!reuse_block_rows) {
          kpos += static_cast<size_t>(rows) * d;
          vpos += static_cast<size_t>(rows) * dv;
        }
        offset.push_back(offset.back() + rows);
        real_rows.push_back(real);
        head.push_back(static_cast<uint32_t>(job.kv_head));
        bid.push_back(static_cast<uint32_t>(blk));
        ++sp.num_blocks;
      }
      spans.push_back(sp);
    }
    if (spans.empty()) break;

    if (!walk_each_block) {
      batch.d = d;
      batch.dv = dv;
      batch.num_blocks = static_cast<int>(head.size());
      batch.keys = keys.data();
      batch.values = values.data();
      batch.block_offset = offset.data();
      batch.block_head = head.data();
      batch.block_id = bid.data();
      batch.sigma = sigma.data();
      batch.p = p.data();
      batch.partial = partial.data();
      backend->walk_blocks(batch);
    }

    for (const Span& sp : spans) {
      JobState& s = st[sp.job];
      const WalkJob& job = jobs[sp.job];
      const int n = static_cast<int>(s.seq.size());
      // The real rows' signs in walk order (padding rows dropped), and the saturation count.
      std::vector<int8_t> sg;
      sg.reserve(n);
      for (int b = 0; b < sp.num_blocks; ++b) {
        const int gb = sp.first_block + b;
        const int r0 = offset[gb];
        sg.insert(sg.end(), sigma.begin() + r0, sigma.begin() + r0 + real_rows[gb]);
        for (int i = 1; i < real_rows[gb]; ++i)
          if (!(p[r0 + i] > 0.0f && p[r0 + i] < 1.0f)) ++s.out.saturated_steps;
        s.out.walked_steps += std::max(0, real_rows[gb] - 1);
      }
      const bool last = round + 1 == static_cast<int>(s.schedule.size());
      const int keep = s.schedule[round];
      Halving h =
          prm.halving == HalvingRule::Authors ? authors_halving(sg, keep) : exact_halving(sg, keep);

      // Top-up after the last round when the schedule undershoots the target (ratios that are
      // not powers of two): draw the missing tokens uniformly without replacement from this
      // round's dropped tokens (all are prefix-majority tokens), keep them at their accumulated
      // weight, and lower the prefix-minority factor from 2 to f = 2 - W_added / W_dropped so
      // the prefix is still represented once: f = 2 when nothing is added, f = 1 when every
      // dropped token comes back.
      std::vector<int> added;
      if (last && keep < job.target && job.top_up) {
        std::vector<int> dropped;  // every position the halving did not keep, in walk order
        std::vector<char> is_kept(n, 0);
        for (int pos : h.kept) is_kept[pos] = 1;
        for (int i = 0; i < n; ++i)
          if (!is_kept[i]) dropped.push_back(i);
        const int need = std::min<int>(job.target - keep, static_cast<int>(dropped.size()));
        for (int i = 0; i < need; ++i) {
          const double u = counter_uniform(
              seed, kRandTopUp, static_cast<uint32_t>(layer), static_cast<uint32_t>(job.kv_head),
              static_cast<uint32_t>(round), 0, static_cast<uint32_t>(i));
          const int rem = static_cast<int>(dropped.size()) - i;
          const int pick = i + std::min(rem - 1, static_cast<int>(u * rem));
          std::swap(dropped[i], dropped[pick]);
        }
        added.assign(dropped.begin(), dropped.begin() + need);
        double w_dropped = 0, w_added = 0;
        for (int pos : dropped) w_dropped += s.w[pos];
        for (int pos : added) w_added += s.w[pos];
        const double f = w_dropped > 0 ? 2.0 - w_added / w_dropped : 2.0;
        for (size_t k = 0; k < h.kept.size(); ++k)
          if (h.factor[k] == 2.0) h.factor[k] = f;
        s.out.topped_up = need;
      }

      // Trace the round before the sequence is replaced.
      if (!job.trace_query.empty()) {
        std::vector<int> kept_flag(n, 0);
        for (int pos : h.kept) kept_flag[pos] = 1;
        for (int pos : added) kept_flag[pos] = 2;
        for (int b = 0; b < sp.num_blocks; ++b) {
          const int gb = sp.first_block + b;
          const int r0 = offset[gb], len = real_rows[gb], r1 = r0 + len, start = b * block;
          WalkBlockTrace t;
          t.round = round;
          t.block = b;
          t.block_start = start;
          t.round_cut = h.cut;
          t.halving_cut = h.cut >= start && h.cut < start + len ? h.cut - start : -1;
          t.tokens.assign(s.seq.begin() + start, s.seq.begin() + start + len);
          t.p.assign(p.begin() + r0, p.begin() + r1);
          t.partial.assign(partial.begin() + r0, partial.begin() + r1);
          t.sigma.assign(sigma.begin() + r0, sigma.begin() + r1);
          t.kept.assign(kept_flag.begin() + start, kept_flag.begin() + start + len);
          int sat = 0;
          for (int i = 1; i < len; ++i)
            if (!(t.p[i] > 0.0 && t.p[i] < 1.0)) ++sat;
          t.saturation = len > 1 ? static_cast<double>(sat) / (len - 1) : 0.0;
          const MatrixD kern =
              block_kernel(keys.data() + static_cast<long>(r0) * d,
                           values.data() + static_cast<long>(r0) * dv, len, d, dv, prm);
          const MatrixD qt = query_terms(job, t.tokens, s.w.data() + start, len);
          fill_block_trace(t, kern, qt, seed, static_cast<uint32_t>(layer),
                           static_cast<uint32_t>(job.kv_head), static_cast<uint32_t>(round),
                           static_cast<uint32_t>(b));
          s.out.trace_blocks.push_back(std::move(t));
        }
      }

      std::vector<std::pair<int, double>> next;  // (position, factor)
      next.reserve(h.kept.size() + added.size());
      for (size_t k = 0; k < h.kept.size(); ++k) next.push_back({h.kept[k], h.factor[k]});
      for (int pos : added) next.push_back({pos, 1.0});
      if (!added.empty()) std::sort(next.begin(), next.end());  // h.kept is already ascending
      std::vector<int> seq;
      std::vector<double> w;
      seq.reserve(next.size());
      w.reserve(next.size());
      for (auto [pos, f] : next) {
        seq.push_back(s.seq[pos]);
        w.push_back(s.w[pos] * f);
      }
      s.seq = std::move(seq);
      s.w = std::move(w);
      s.out.rounds = round + 1;
    }
  }

  // Keep the reusable buffers for the next call (live slider moves on one head), but do not let
  // one layer-sized call pin hundreds of MB on this thread.
  if (keys.capacity() + values.capacity() > (size_t{32} << 20)) {
    std::vector<float>().swap(keys);
    std::vector<float>().swap(values);
    std::vector<float>().swap(p);
    std::vector<float>().swap(partial);
    std::vector<int8_t>().swap(sigma);
    std::vector<int>().swap(real_rows);
  }

  std::vector<WalkOutcome> out(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    out[j] = std::move(st[j].out);
    out[j].indices = std::move(st[j].seq);
    out[j].weights = std::move(st[j].w);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The method for one head, and the whole layer.

namespace {

struct HeadPlan {
  bool trivial = false;  // nothing to walk: `result` is final
  Selection result;
  std::vector<int> protected_tokens;
  bool protect_capped = false;
  WalkJob job;
  int trace_position = -1;
  int budget = 0;
};

void check_input(const MethodInput& in) {
  if (!in.keys || !in.values) throw InputError("balancekv: no keys/values given");
  std::ostringstream os;
  if (in.keys->rows() != in.n || in.values->rows() != in.n) {
    os << "balancekv: keys have " << in.keys->rows() << " rows and values " << in.values->rows()
       << ", expected n = " << in.n;
    throw InputError(os.str());
  }
  if (in.mid_begin < 0 || in.mid_end < in.mid_begin || in.mid_end > in.n) {
    os << "balancekv: middle [" << in.mid_begin << ", " << in.mid_end
       << ") does not fit n = " << in.n;
    throw InputError(os.str());
  }
  if (in.budget < 0 || in.budget > in.mid_end - in.mid_begin) {
    os << "balancekv: budget m = " << in.budget << " is outside [0, " << in.mid_end - in.mid_begin
       << "] (the middle's length)";
    throw InputError(os.str());
  }
}

HeadPlan plan_head(const MethodInput& in, const BalanceParams& prm) {
  check_input(in);
  HeadPlan plan;
  const int n_mid = in.mid_end - in.mid_begin;
  const int m = in.budget;
  if (m == 0 || m >= n_mid) {
    plan.trivial = true;
    if (m > 0) {
      for (int t = in.mid_begin; t < in.mid_end; ++t) {
        plan.result.indices.push_back(t);
        plan.result.weights.push_back(1.0);
      }
      plan.result.note = "budget covers the whole middle: nothing to compress";
    } else {
      plan.result.note = "budget 0: nothing kept from the middle";
    }
    return plan;
  }
  if (prm.protect_anticorrelated) {
    plan.protected_tokens =
        protected_anticorrelated(*in.keys, in.mid_begin, in.mid_end, prm.block, m / 2);
    plan.protect_capped = static_cast<int>(plan.protected_tokens.size()) == m / 2;
  }
  plan.job.keys = in.keys;
  plan.job.values = in.values;
  plan.job.kv_head = in.kv_head;
  plan.job.target = m - static_cast<int>(plan.protected_tokens.size());
  // kept = floor-halving keeps what log2(1/ratio) floor halvings leave (at most the budget); only
  // a ratio that is not a power of two is topped up to the budget after ceil(log2(1/ratio)) rounds.
  const double rounds = std::log2(1.0 / in.keep_ratio);
  const bool power_of_two = in.keep_ratio > 0 && std::abs(rounds - std::round(rounds)) < 1e-9;
  plan.job.top_up = prm.kept == KeptCount::Budget || !power_of_two;
  plan.budget = m;
  size_t k = 0;
  for (int t = in.mid_begin; t < in.mid_end; ++t) {
    if (k < plan.protected_tokens.size() && plan.protected_tokens[k] == t) {
      ++k;
      continue;
    }
    plan.job.tokens.push_back(t);
  }
  if (in.want_trace) plan.job.trace_query = trace_query_vector(in, &plan.trace_position);
  return plan;
}

Selection finish_head(HeadPlan& plan, WalkOutcome& out, const MethodInput& in) {
  Selection sel;
  std::vector<std::pair<int, double>> all;
  for (int t : plan.protected_tokens) all.push_back({t, 1.0});
  for (size_t i = 0; i < out.indices.size(); ++i) all.push_back({out.indices[i], out.weights[i]});
  std::sort(all.begin(), all.end());
  for (auto [t, w] : all) {
    sel.indices.push_back(t);
    sel.weights.push_back(w);
  }
  std::ostringstream note;
  const int kept = static_cast<int>(sel.indices.size());
  const double saturation =
      out.walked_steps > 0 ? static_cast<double>(out.saturated_steps) / out.walked_steps : 0.0;
  note << "kept " << kept << " of budget " << plan.budget << "; " << out.rounds << " halving round"
       << (out.rounds == 1 ? "" : "s") << " over " << plan.job.tokens.size() << " tokens; "
       << std::lround(100.0 * saturation) << "% of steps saturated (p clipped to 0 "
       << "or 1)";
  if (saturation >= 0.9)
    note << ": the walk is nearly deterministic (p is forced, not drawn); temp and gamma set "
            "how hard the kernel pushes";
  if (out.topped_up > 0)
    note << "; keep ratio is not a power of two: topped up " << out.topped_up
         << " tokens uniformly from the last round's dropped tokens (their partners' weight "
            "lowered from 2 so the prefix stays represented once)";
  if (!plan.protected_tokens.empty())
    note << "; " << plan.protected_tokens.size()
         << " anti-correlated keys protected at weight 1 outside the walk"
         << (plan.protect_capped ? " (capped at half the budget)" : "");
  sel.note = note.str();
  sel.saturation = saturation;
  if (in.want_trace) {
    auto tr = std::make_shared<WalkTrace>();
    tr->rounds = out.rounds;
    tr->saturation = saturation;
    tr->saturated_steps = out.saturated_steps;
    tr->walked_steps = out.walked_steps;
    tr->kept = kept;
    tr->budget = plan.budget;
    tr->trace_query = plan.trace_position;
    tr->blocks = std::move(out.trace_blocks);
    tr->note = sel.note;
    sel.trace = std::move(tr);
  }
  return sel;
}

}  // namespace

Selection balancekv_select(const MethodInput& in) {
  const BalanceParams prm = balance_params_from(in.params);
  HeadPlan plan = plan_head(in, prm);
  if (plan.trivial) return plan.result;
  std::vector<WalkOutcome> out = run_balance_walks({plan.job}, in.layer, in.seed, prm, in.backend);
  return finish_head(plan, out[0], in);
}

std::vector<Selection> balancekv_layer(const LayerData& layer, int num_layers, const EvalWindow& w,
                                       uint64_t seed, const ParamValues& params, Backend& backend,
                                       bool want_trace, int trace_query) {
  const BalanceParams prm = balance_params_from(params);
  const int heads = static_cast<int>(layer.keys.size());
  std::vector<Selection> result(heads);
  std::vector<MethodInput> inputs(heads);
  std::vector<HeadPlan> plans(heads);
  std::vector<WalkJob> jobs;
  std::vector<int> job_head;
  for (int h = 0; h < heads; ++h) {
    if (h < static_cast<int>(layer.refused.size()) && !layer.refused[h].empty()) {
      result[h].note = "head refused: " + layer.refused[h];
      continue;
    }
    MethodInput& in = inputs[h];
    in = make_method_input(layer, num_layers, h, w, params, seed);
    in.want_trace = want_trace;
    in.trace_query = trace_query;
    in.backend = &backend;
    plans[h] = plan_head(in, prm);
    if (plans[h].trivial) {
      result[h] = plans[h].result;
      continue;
    }
    jobs.push_back(plans[h].job);
    job_head.push_back(h);
  }
  std::vector<WalkOutcome> out;
  const unsigned threads = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()),
                                              static_cast<unsigned>(jobs.size()));
  if (backend.is_gpu() || threads <= 1) {
    // One walk_blocks call per round for all heads: the GPU kernel parallelises over them.
    out = run_balance_walks(jobs, layer.layer, seed, prm, &backend);
  } else {
    // The CPU op is sequential; spread the heads over the cores instead. The result is the
    // same: the walk's random numbers do not depend on which heads share a call.
    out.resize(jobs.size());
    std::vector<std::exception_ptr> errors(threads);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        try {
          std::vector<WalkJob> mine;
          std::vector<size_t> where;
          for (size_t j = t; j < jobs.size(); j += threads) {
            mine.push_back(jobs[j]);
            where.push_back(j);
          }
          std::vector<WalkOutcome> got = run_balance_walks(mine, layer.layer, seed, prm, &backend);
          for (size_t k = 0; k < got.size(); ++k) out[where[k]] = std::move(got[k]);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    for (std::thread& th : pool) th.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int h = job_head[j];
    result[h] = finish_head(plans[h], out[j], inputs[h]);
  }
  return result;
}

}  // namespace kvscope
