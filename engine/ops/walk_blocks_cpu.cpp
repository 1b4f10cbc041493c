// The CPU reference of the walk op (Backend::walk_blocks, engine/ops/walk_blocks.h): one
// self-balancing walk per block of a WalkBatch, in float32 (the authors' semantics) or double. The
// rounds, halving and weights around it are engine/methods/balancekv/balance_walk.cpp's; the CUDA
// kernel (kernels/walk_blocks.cu) is tested against this file (tests/test_cuda_parity.cpp).
#include "engine/ops/walk_blocks_cpu.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "engine/core/random.h"
#include "engine/core/simd.h"
#include "engine/core/tensor.h"
#include "engine/ops/backend.h"
#include "engine/ops/walk_blocks.h"

namespace kvscope {

// ---------------------------------------------------------------------------------------------
// The CPU reference of Backend::walk_blocks.
//
// Per block the walk needs K_ij for j < i only (the strictly lower triangle), so we form the two
// block Gram matrices <k_i,k_j> and <v_i,v_j> in double (the product of two floats is exact in
// double; only the accumulation rounds), then run the sequential walk on them. Cost per block of
// L rows: L^2 (d + dv) / 2 multiply-adds for the Grams, L^2 / 2 exponentials and L^2 / 2
// multiply-adds for the walk. The Grams dominate, so where the SIMD table in use has a
// hand-blocked Gram (engine/core/simd.h walk_gram_f64: AVX2+FMA, AVX-512) it computes them (same
// double arithmetic, fused multiply-adds; results agree with the portable path to ~1e-16
// relative). Buffers are thread-local so repeated calls (live slider moves) do not allocate.

namespace {

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
    // The SIMD table's Gram (engine/core/simd.h walk_gram_f64), where it has one.
    const simd::Kernels& k = simd::kernels();
    gram_ = g_walk_simd.load(std::memory_order_relaxed) ? k.walk_gram_f64 : nullptr;
    if (gram_) {
      const int lanes = k.walk_gram_f64_lanes;
      const int rows4 = (len + 3) / 4 * 4;
      dimp_ = (dim + lanes - 1) / lanes * lanes;
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
    ld_ = len;
    xd_ = Eigen::Map<const MatrixF>(rows, len, dim).cast<double>();
  }

  // Makes rows [p0, min(p0 + kPanel, len)) available through row(); p0 % kPanel == 0.
  void panel(int p0) {
    p0_ = p0;
    const int p1 = std::min(len_, p0 + kPanel);
    if (gram_) {
      const int iend = (p1 + 1) / 2 * 2;
      g_.resize(static_cast<size_t>(kPanel) * ld_);
      gram_(x_.data(), p0, iend, dimp_, ld_, g_.data());
      return;
    }
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
  const double* row(int i) const { return g_.data() + static_cast<size_t>(i - p0_) * ld_; }

 private:
  int len_ = 0, ld_ = 0, p0_ = 0, dimp_ = 0;
  void (*gram_)(const double*, int, int, int, int, double*) = nullptr;
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
  // The Gram kernel's per-tile hook (engine/core/simd.h walk_gram_f32): the next per_tile lines.
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

// The block's Gram matrices come from the SIMD table's walk_gram_f32 (engine/core/simd.h): those of
// CUDA's gram_tile (kernels/walk_blocks.cu) bit for bit, each entry summed by one fused
// multiply-add per feature in order. (torch's sgemm sums in its own order; the golden cases do not
// depend on which.) That order is also the fast one on a CPU: the kernel is an outer product, 8 or
// 16 entries per vector, so no entry needs a horizontal sum, and AVX-512 only widens it. The same
// table packs the rows for it, computes the kernel rows (a polynomial exp, 8 or 16 entries per
// vector) and the sign loop's dot products (walk_pack_panels16, walk_kernel_rows_f32,
// walk_dot_f32); without it, the portable loops below.

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
  // The fused Gram of the SIMD table in use and its other float32 walk entries
  // (KVSCOPE_SIMD=sse2 or set_cpu_walk_simd(false): the portable loops, a rounding apart).
  const simd::Kernels& kern = simd::kernels();
  const auto gram = kern.walk_gram_f32;
  const bool simd = g_walk_simd.load(std::memory_order_relaxed) && gram;
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
  if (simd) {
    const size_t packed = static_cast<size_t>((len + 15) / 16) * 16;
    w.pk.resize(packed * b.d);
    w.pv.resize(packed * b.dv);
    kern.walk_pack_panels16(xk, len, b.d, w.pk.data());
    kern.walk_pack_panels16(xv, len, b.dv, w.pv.data());
  }
  for (int p0 = 0; p0 < len; p0 += kPanel) {
    const int p1 = std::min(len, p0 + kPanel);
    if (simd) {
      gram(w.pk.data(), len, b.d, p0, p1, ld, w.gk.data(), RowPrefetch::after_tile, &prefetch);
      gram(w.pv.data(), len, b.dv, p0, p1, ld, w.gv.data(), RowPrefetch::after_tile, &prefetch);
      kern.walk_kernel_rows_f32(w.gk.data(), w.gv.data(), p0, p1, ld, temp, sqrt_d, beta, eps, bias,
                                w.kern.data(), w.tail_bad.data());
      continue;
    }
    gram_lower_f32_portable(xk, b.d, p0, p1, ld, w.gk.data());
    gram_lower_f32_portable(xv, b.dv, p0, p1, ld, w.gv.data());
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
    float partial =
        simd ? kern.walk_dot_f32(ki, w.sig.data(), i) : dot_f32_portable(ki, w.sig.data(), i);
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
  const simd::Kernels& kern = simd::kernels();
  if (g_walk_simd.load(std::memory_order_relaxed) && kern.walk_gram_f32) {
    const int ld = (rows + 15) / 16 * 16;
    std::vector<float> packed(static_cast<size_t>(ld) * dim);
    std::vector<float> full(static_cast<size_t>(rows) * ld);
    kern.walk_pack_panels16(x, rows, dim, packed.data());
    kern.walk_gram_f32(packed.data(), rows, dim, 0, rows, ld, full.data(), nullptr, nullptr);
    for (int i = 0; i < rows; ++i)
      std::copy_n(full.data() + static_cast<size_t>(i) * ld, i + 1, g + static_cast<long>(i) * ldg);
    return;
  }
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

OpShape op_shape(const WalkBatch& b) {
  const int64_t rows = b.num_blocks > 0 && b.block_offset ? b.block_offset[b.num_blocks] : 0;
  return {Op::walk_blocks, rows, b.d, b.dv, b.num_blocks, false};
}

}  // namespace kvscope
