// FFT-accelerated interpolation of the t-SNE repulsion (see tsne_fft.h for the method).
#include "engine/ops/tsne_gradient_fft.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "engine/core/thread_pool.h"
#include "engine/ops/tsne_box.h"

namespace kvscope {
namespace {

// Lanes of one FFT strip: 16 independent transforms run side by side, one per float of a
// 64-byte line, so every butterfly is a vector operation across the strip.
constexpr int kLanes = 16;

// The butterflies run on vectors of kVec lanes (GCC/Clang vector extension): 8 floats where the
// build has AVX (-march=native), 4 (SSE) in a portable build.
#ifdef __AVX__
constexpr int kVec = 8;
#else
constexpr int kVec = 4;  // SSE: a wider vector type would change the ABI of the helpers below
#endif
typedef float Vec __attribute__((vector_size(kVec * sizeof(float))));
static_assert(kLanes % kVec == 0);
inline Vec load_vec(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec(float* p, Vec v) {
  std::memcpy(p, &v, sizeof v);
}
// The four charges (and potentials) of one node, and their sums in double.
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));
typedef double Vec4d __attribute__((vector_size(4 * sizeof(double))));
inline Vec4 load_vec4(const float* p) {
  Vec4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store_vec4(float* p, Vec4 v) {
  std::memcpy(p, &v, sizeof v);
}

// The smallest m >= at_least whose only prime factors are 2, 3 and 5.
int fft_friendly_size(int at_least) {
  for (int m = std::max(at_least, 1);; ++m) {
    int r = m;
    for (int f : {2, 3, 5})
      while (r % f == 0) r /= f;
    if (r == 1) return m;
  }
}

// A mixed-radix (4, 2, 3, 5) FFT of length M, in place, on kLanes transforms at once: element t
// of lane c lives at re[t * stride + c], im[t * stride + c]. Forward: decimation in frequency,
// sign -1, output in digit-reversed order. Inverse: decimation in time, sign +1, input in that
// same digit-reversed order, output natural and unscaled. So forward, a pointwise product with a
// spectrum taken by the same forward transform, and inverse is M times a circular convolution:
// the order never needs to be undone.
class StripFft {
 public:
  explicit StripFft(int M) : M_(M) {
    int rest = M;
    std::vector<int> radices;
    while (rest % 4 == 0) radices.push_back(4), rest /= 4;
    while (rest % 2 == 0) radices.push_back(2), rest /= 2;
    while (rest % 3 == 0) radices.push_back(3), rest /= 3;
    while (rest % 5 == 0) radices.push_back(5), rest /= 5;
    if (rest != 1) throw std::logic_error("StripFft: size has a prime factor above 5");
    int len = M;
    for (int r : radices) {
      Stage s;
      s.radix = r;
      s.len = len;
      s.m = len / r;
      // Twiddle w_len^(q k) = exp(-2 pi i q k / len) for q = 1..r-1, k < m.
      s.tw_re.resize(static_cast<size_t>(r - 1) * s.m);
      s.tw_im.resize(static_cast<size_t>(r - 1) * s.m);
      for (int q = 1; q < r; ++q)
        for (int k = 0; k < s.m; ++k) {
          const double a = -2.0 * M_PI * q * k / len;
          s.tw_re[static_cast<size_t>(q - 1) * s.m + k] = static_cast<float>(std::cos(a));
          s.tw_im[static_cast<size_t>(q - 1) * s.m + k] = static_cast<float>(std::sin(a));
        }
      stages_.push_back(std::move(s));
      len /= r;
    }
  }
  int size() const { return M_; }

  // `live`: the inputs at t >= live are zero (they are not read, and need not be stored).
  void forward(float* re, float* im, size_t stride, int live) const {
    if (!stages_.empty()) return forward_block(0, re, im, stride, 0, live);
    if (live < M_) std::fill(re, re + kLanes, 0.f), std::fill(im, im + kLanes, 0.f);  // M = 1
  }
  void forward(float* re, float* im, size_t stride) const { forward(re, im, stride, M_); }
  // `keep`: only the outputs t < keep are wanted (the others are left unspecified).
  void inverse(float* re, float* im, size_t stride, int keep) const {
    if (!stages_.empty()) inverse_block(0, re, im, stride, 0, keep);
  }
  // forward(live), the pointwise product with a spectrum taken by forward (hat_re + i hat_im;
  // real where hat_im is null; laid out like the strip: M x kLanes), inverse(keep), on one strip
  // of stride kLanes: M times the circular convolution. Fused: below the top stage each block
  // goes forward, through the product and back while it is in L1.
  void convolve(float* re, float* im, int live, int keep, const float* hat_re,
                const float* hat_im) const {
    if (hat_im)
      convolve_block<true>(0, re, im, 0, live, keep, hat_re, hat_im);
    else
      convolve_block<false>(0, re, im, 0, live, keep, hat_re, hat_im);
  }

 private:
  struct Stage {
    int radix, len, m;
    std::vector<float> tw_re, tw_im;
  };

  // The stages run depth first: stage i on one block of length stages_[i].len, then (forward)
  // each of its radix sub-blocks through all later stages before the next, so that once a block
  // fits in L1 all its remaining passes stay there (breadth first, every stage would stream the
  // whole strip, 86 KB at M = 675, through L2). The inverse runs the same tree bottom up.
  // `limit` prunes the top block only: inputs (forward) or outputs (inverse) at t >= limit.
  void forward_block(size_t i, float* re, float* im, size_t stride, int start, int limit) const {
    const Stage& s = stages_[i];
    run_stage<false>(s, re, im, stride, start, limit);
    if (i + 1 < stages_.size())
      for (int b = 0; b < s.radix; ++b) forward_block(i + 1, re, im, stride, start + b * s.m, M_);
  }
  void inverse_block(size_t i, float* re, float* im, size_t stride, int start, int limit) const {
    const Stage& s = stages_[i];
    if (i + 1 < stages_.size())
      for (int b = 0; b < s.radix; ++b) inverse_block(i + 1, re, im, stride, start + b * s.m, M_);
    run_stage<true>(s, re, im, stride, start, limit);
  }

  template <bool ComplexHat>
  void convolve_block(size_t i, float* re, float* im, int start, int live, int keep,
                      const float* hat_re, const float* hat_im) const {
    if (i < stages_.size()) {
      const Stage& s = stages_[i];
      run_stage<false>(s, re, im, kLanes, start, live);
      for (int b = 0; b < s.radix; ++b)
        convolve_block<ComplexHat>(i + 1, re, im, start + b * s.m, M_, M_, hat_re, hat_im);
      run_stage<true>(s, re, im, kLanes, start, keep);
      return;
    }
    // A leaf: one entry of every lane, transformed (M = 1: the input itself, zero if not live).
    const size_t at = static_cast<size_t>(start) * kLanes;
    for (int c = 0; c < kLanes; c += kVec) {
      Vec xr = start < live ? load_vec(re + at + c) : Vec{};
      Vec xi = start < live ? load_vec(im + at + c) : Vec{};
      const Vec hr = load_vec(hat_re + at + c);
      if constexpr (ComplexHat) {
        const Vec hi = load_vec(hat_im + at + c);
        const Vec a = xr * hr - xi * hi;
        xi = xr * hi + xi * hr;
        xr = a;
      } else {
        xr *= hr;
        xi *= hr;
      }
      store_vec(re + at + c, xr);
      store_vec(im + at + c, xi);
    }
  }

  template <bool Inverse>
  void run_stage(const Stage& s, float* re, float* im, size_t stride, int start, int limit) const {
    switch (s.radix) {
      case 4:
        return radix_stage<4, Inverse>(s, re, im, stride, start, limit);
      case 2:
        return radix_stage<2, Inverse>(s, re, im, stride, start, limit);
      case 3:
        return radix_stage<3, Inverse>(s, re, im, stride, start, limit);
      default:
        return radix_stage<5, Inverse>(s, re, im, stride, start, limit);
    }
  }

  // The R-point DFT of (xr, xi) with sign -1 (forward) or +1 (inverse), in place; T is a float or
  // a vector of kVec lanes (the arithmetic is the same, the constants broadcast).
  template <int R, bool Inverse, class T>
  static inline void small_dft(T* xr, T* xi) {
    constexpr float sg = Inverse ? 1.f : -1.f;
    if constexpr (R == 2) {
      const T ar = xr[0] + xr[1], ai = xi[0] + xi[1];
      xr[1] = xr[0] - xr[1];
      xi[1] = xi[0] - xi[1];
      xr[0] = ar;
      xi[0] = ai;
    } else if constexpr (R == 4) {
      const T s0r = xr[0] + xr[2], s0i = xi[0] + xi[2];
      const T d0r = xr[0] - xr[2], d0i = xi[0] - xi[2];
      const T s1r = xr[1] + xr[3], s1i = xi[1] + xi[3];
      const T d1r = xr[1] - xr[3], d1i = xi[1] - xi[3];
      // X1 = d0 + sg i d1, X3 = d0 - sg i d1.
      xr[0] = s0r + s1r;
      xi[0] = s0i + s1i;
      xr[2] = s0r - s1r;
      xi[2] = s0i - s1i;
      if constexpr (Inverse) {
        xr[1] = d0r - d1i;
        xi[1] = d0i + d1r;
        xr[3] = d0r + d1i;
        xi[3] = d0i - d1r;
      } else {
        xr[1] = d0r + d1i;
        xi[1] = d0i - d1r;
        xr[3] = d0r - d1i;
        xi[3] = d0i + d1r;
      }
    } else if constexpr (R == 3) {
      constexpr float c = -0.5f, s = sg * 0.86602540378443864676f;
      const T ar = xr[1] + xr[2], ai = xi[1] + xi[2];
      const T br = xr[1] - xr[2], bi = xi[1] - xi[2];
      const T tr = xr[0] + c * ar, ti = xi[0] + c * ai;
      xr[0] += ar;
      xi[0] += ai;
      // X1 = t + i s b, X2 = t - i s b.
      xr[1] = tr - s * bi;
      xi[1] = ti + s * br;
      xr[2] = tr + s * bi;
      xi[2] = ti - s * br;
    } else {
      constexpr float c1 = 0.30901699437494742410f, c2 = -0.80901699437494742410f;
      constexpr float s1 = sg * 0.95105651629515357212f, s2 = sg * 0.58778525229247312917f;
      const T a1r = xr[1] + xr[4], a1i = xi[1] + xi[4];
      const T b1r = xr[1] - xr[4], b1i = xi[1] - xi[4];
      const T a2r = xr[2] + xr[3], a2i = xi[2] + xi[3];
      const T b2r = xr[2] - xr[3], b2i = xi[2] - xi[3];
      const T t1r = xr[0] + c1 * a1r + c2 * a2r, t1i = xi[0] + c1 * a1i + c2 * a2i;
      const T t2r = xr[0] + c2 * a1r + c1 * a2r, t2i = xi[0] + c2 * a1i + c1 * a2i;
      const T u1r = s1 * b1r + s2 * b2r, u1i = s1 * b1i + s2 * b2i;  // X1 = t1 + i u1
      const T u2r = s2 * b1r - s1 * b2r, u2i = s2 * b1i - s1 * b2i;  // X2 = t2 + i u2
      xr[0] += a1r + a2r;
      xi[0] += a1i + a2i;
      xr[1] = t1r - u1i;
      xi[1] = t1i + u1r;
      xr[4] = t1r + u1i;
      xi[4] = t1i - u1r;
      xr[2] = t2r - u2i;
      xi[2] = t2i + u2r;
      xr[3] = t2r + u2i;
      xi[3] = t2i - u2r;
    }
  }

  // One stage on the block [start, start + s.len). Forward (DIF): the R inputs k + j m, DFT,
  // output q times w_len^(q k) to k + q m. Inverse (DIT): exactly the adjoint steps in reverse
  // (conjugate twiddle, then the +1 DFT), so it undoes the forward stage up to R. Pruned
  // (limit < start + len): the k are split by how many of their R indices lie below limit, and
  // each range runs with that count fixed at compile time (fewer loads forward, fewer stores
  // inverse; the k with none below the limit are skipped inverse and give zeros forward).
  template <int R, bool Inverse>
  void radix_stage(const Stage& s, float* re, float* im, size_t stride, int start,
                   int limit) const {
    const int m = s.m;
    if (limit >= start + s.len) return butterflies<R, Inverse, R>(s, re, im, stride, start, 0, m);
    const int rel = limit - start;
    for (int count = R; count >= 0; --count) {
      const int k0 = std::max(0, rel - count * m), k1 = std::min(m, rel - (count - 1) * m);
      if (k0 >= k1) continue;
      switch (count) {
        case 0:
          if constexpr (!Inverse) butterflies<R, Inverse, 0>(s, re, im, stride, start, k0, k1);
          break;
        case 1:
          butterflies<R, Inverse, 1>(s, re, im, stride, start, k0, k1);
          break;
        case 2:
          butterflies<R, Inverse, 2>(s, re, im, stride, start, k0, k1);
          break;
        case 3:
          if constexpr (R >= 3) butterflies<R, Inverse, 3>(s, re, im, stride, start, k0, k1);
          break;
        case 4:
          if constexpr (R >= 4) butterflies<R, Inverse, 4>(s, re, im, stride, start, k0, k1);
          break;
        default:
          if constexpr (R >= 5) butterflies<R, Inverse, 5>(s, re, im, stride, start, k0, k1);
          break;
      }
    }
  }

  // The butterflies k in [k0, k1) of one block; Live of the R inputs are read forward (the rest
  // are zero), Live of the R outputs are stored inverse.
  template <int R, bool Inverse, int Live>
  void butterflies(const Stage& s, float* re, float* im, size_t stride, int start, int k0,
                   int k1) const {
    constexpr int kRead = Inverse ? R : Live, kStored = Inverse ? Live : R;
    const int m = s.m;
    for (int k = k0; k < k1; ++k) {
      float* pr[R];
      float* pi[R];
      float wr[R], wi[R];
      for (int j = 0; j < R; ++j) {
        pr[j] = re + static_cast<size_t>(start + k + j * m) * stride;
        pi[j] = im + static_cast<size_t>(start + k + j * m) * stride;
      }
      wr[0] = 1, wi[0] = 0;
      for (int q = 1; q < R; ++q) {
        wr[q] = s.tw_re[static_cast<size_t>(q - 1) * m + k];
        wi[q] = Inverse ? -s.tw_im[static_cast<size_t>(q - 1) * m + k]
                        : s.tw_im[static_cast<size_t>(q - 1) * m + k];
      }
      const bool plain = k == 0;  // all twiddles 1
      for (int c = 0; c < kLanes; c += kVec) {
        Vec xr[R], xi[R];
        for (int j = 0; j < R; ++j) {
          if (j < kRead) {
            xr[j] = load_vec(pr[j] + c);
            xi[j] = load_vec(pi[j] + c);
          } else {
            xr[j] = Vec{};
            xi[j] = Vec{};
          }
        }
        if (Inverse && !plain)
          for (int q = 1; q < R; ++q) {
            const Vec a = xr[q] * wr[q] - xi[q] * wi[q];
            xi[q] = xr[q] * wi[q] + xi[q] * wr[q];
            xr[q] = a;
          }
        small_dft<R, Inverse>(xr, xi);
        if (!Inverse && !plain)
          for (int q = 1; q < R; ++q) {
            const Vec a = xr[q] * wr[q] - xi[q] * wi[q];
            xi[q] = xr[q] * wi[q] + xi[q] * wr[q];
            xr[q] = a;
          }
        for (int j = 0; j < kStored; ++j) {
          store_vec(pr[j] + c, xr[j]);
          store_vec(pi[j] + c, xi[j]);
        }
      }
    }
  }

  int M_;
  std::vector<Stage> stages_;
};

// A complex grid in split form, M rows of `ld` floats (ld a multiple of kLanes, padded so rows
// do not alias in the cache).
struct Grid {
  int rows = 0, ld = 0;
  std::vector<float> re, im;
  void reset(int m, int columns) {
    rows = m;
    ld = (columns + kLanes - 1) / kLanes * kLanes;
    if (ld % 256 == 0) ld += kLanes;
    re.assign(static_cast<size_t>(m) * ld, 0.f);
    im.assign(static_cast<size_t>(m) * ld, 0.f);
  }
  size_t at(int row, int col) const { return static_cast<size_t>(row) * ld + col; }
};

// The 2-D transforms of a grid whose data lie in rows and columns [0, N): the column transforms
// (along the row index) strip by strip in place, and the row transforms through a scratch strip
// that holds kLanes rows transposed (column index major), so they too run across lanes. Both
// are pruned: forward, rows [N, M) are zero and not read; inverse, only rows [0, N) are
// computed (rows [N, M) are left unspecified).
void column_transforms(const StripFft& fft, Grid& g, int N, bool inverse) {
  for (int c0 = 0; c0 < N; c0 += kLanes) {
    if (inverse) {
      fft.inverse(g.re.data() + c0, g.im.data() + c0, g.ld, N);
    } else {
      fft.forward(g.re.data() + c0, g.im.data() + c0, g.ld, N);
    }
  }
}

#ifdef __AVX__
// dst row c = src column c, for an 8 x 8 block.
inline void transpose8x8(const float* src, size_t src_ld, float* dst, size_t dst_ld) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dst_ld, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}
#endif

// dst[c * dst_ld + r] = src[r * src_ld + c] for r < rows, c < cols: 8 x 8 blocks in registers
// where AVX is there, the edges (and everything without AVX) one float at a time.
void transpose(const float* src, size_t src_ld, float* dst, size_t dst_ld, int rows, int cols) {
  int r = 0;
#ifdef __AVX__
  for (; r + 8 <= rows; r += 8) {
    int c = 0;
    for (; c + 8 <= cols; c += 8)
      transpose8x8(src + r * src_ld + c, src_ld, dst + c * dst_ld + r, dst_ld);
    for (; c < cols; ++c)
      for (int i = r; i < r + 8; ++i) dst[c * dst_ld + i] = src[i * src_ld + c];
  }
#endif
  for (; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[c * dst_ld + r] = src[r * src_ld + c];
}

// Rows [r0, r0 + kLanes) of g, columns [0, cols), into the scratch strip (M x kLanes; what lies
// beyond cols is left as it is: the pruned forward transform does not read it).
void load_strip(const Grid& g, int r0, int cols, float* sre, float* sim) {
  const int lanes = std::min(kLanes, g.rows - r0);
  transpose(&g.re[g.at(r0, 0)], g.ld, sre, kLanes, lanes, cols);
  transpose(&g.im[g.at(r0, 0)], g.ld, sim, kLanes, lanes, cols);
}

void store_strip(Grid& g, int r0, int cols, const float* sre, const float* sim) {
  const int lanes = std::min(kLanes, g.rows - r0);
  transpose(sre, kLanes, &g.re[g.at(r0, 0)], g.ld, cols, lanes);
  transpose(sim, kLanes, &g.im[g.at(r0, 0)], g.ld, cols, lanes);
}

// The per-point data of one call, kept across calls for their buffers.
struct PointsByBoxRow {
  // The points by box row (order[o] = i), where each box row starts in that order, its box row.
  std::vector<int> order, row_start, row_fill, box_row;
  // In that order: position relative to the grid centre, Lagrange weights (p per axis), first
  // node of the box.
  std::vector<double> pos;
  std::vector<float> wx, wy;
  std::vector<int> gx, gy;
};

}  // namespace

// The state kept across iterations: the FFT plan and the kernel's spectrum (reused while the
// padded size and the node spacing stay the same: the spacing is quantised to steps of 2^(1/32)
// so a slowly growing embedding keeps it for several iterations), and the two charge grids.
struct TsneFftRepulsion::State {
  int M = 0, N = 0;
  double spacing = 0;
  std::unique_ptr<StripFft> fft;
  // The kernel's spectrum, real (the kernel is even), scaled by 1 / M^2, in the order the row
  // strips see it: [strip][column][lane].
  std::vector<float> kernel_hat;
  Grid a, b;  // charges 1 + i y_x and y_y + i |y|^2 (relative to the grid centre)
  PointsByBoxRow points;
  std::vector<float> nodes;         // N x N x 4: the charges, then the potentials, interleaved
  std::vector<double> rep, z_each;  // the results
};

TsneFftRepulsion::TsneFftRepulsion(const TsneFftParams& params)
    : params_(params), state_(std::make_unique<State>()) {
  if (params_.nodes_per_box < 2 || params_.nodes_per_box > 8 || params_.min_boxes < 1 ||
      !(params_.max_box > 0))
    throw std::invalid_argument("t-SNE FFT: bad interpolation parameters");
}
TsneFftRepulsion::~TsneFftRepulsion() = default;

namespace {

// The kernel w^2 = 1 / (1 + r^2)^2 at every lattice offset (a, b), |a|, |b| < N, placed
// circulantly on an M x M grid, transformed like the charges, as [strip][column][lane].
std::vector<float> kernel_spectrum(const StripFft& fft, int M, int N, double spacing) {
  Grid k;
  k.reset(M, M);
  for (int a = -(N - 1); a < N; ++a)
    for (int b = -(N - 1); b < N; ++b) {
      const double dx = a * spacing, dy = b * spacing;
      const double w = 1.0 / (1.0 + dx * dx + dy * dy);
      k.re[k.at((a + M) % M, (b + M) % M)] = static_cast<float>(w * w);
    }
  const int strips_c = (M + kLanes - 1) / kLanes;
  parallel_chunks(strips_c, 4, [&](int sb, int se) {
    for (int s = sb; s < se; ++s) fft.forward(&k.re[s * kLanes], &k.im[s * kLanes], k.ld);
  });
  const int strips_r = (M + kLanes - 1) / kLanes;
  std::vector<float> hat(static_cast<size_t>(strips_r) * M * kLanes);
  const float scale = static_cast<float>(1.0 / (double(M) * M));
  parallel_chunks(strips_r, 4, [&](int sb, int se) {
    std::vector<float> sre(static_cast<size_t>(M) * kLanes), sim(sre.size());
    for (int s = sb; s < se; ++s) {
      load_strip(k, s * kLanes, M, sre.data(), sim.data());
      fft.forward(sre.data(), sim.data(), kLanes);
      float* out = &hat[static_cast<size_t>(s) * M * kLanes];
      for (size_t t = 0; t < sre.size(); ++t) out[t] = sre[t] * scale;
    }
  });
  return hat;
}

// Convolves grid g (data in rows and columns [0, N)) with the kernel; afterwards rows and
// columns [0, N) hold the potentials.
void convolve(const StripFft& fft, const std::vector<float>& kernel_hat, Grid& g, int M, int N) {
  column_transforms(fft, g, N, false);
  std::vector<float> sre(static_cast<size_t>(M) * kLanes), sim(sre.size());
  for (int r0 = 0; r0 < M; r0 += kLanes) {
    load_strip(g, r0, N, sre.data(), sim.data());
    fft.convolve(sre.data(), sim.data(), N, N,
                 &kernel_hat[static_cast<size_t>(r0 / kLanes) * M * kLanes], nullptr);
    store_strip(g, r0, N, sre.data(), sim.data());
  }
  column_transforms(fft, g, N, true);
}

}  // namespace

namespace {

// The p Lagrange polynomials on the nodes at t (inv_denom[k] = 1 / prod_{l != k} (node_k -
// node_l)).
inline void lagrange_weights(int p, double t, const double* nodes, const double* inv_denom,
                             float* w) {
  for (int k = 0; k < p; ++k) {
    double v = inv_denom[k];
    for (int l = 0; l < p; ++l)
      if (l != k) v *= t - nodes[l];
    w[k] = static_cast<float>(v);
  }
}
template <int P>
inline void lagrange_weights(double t, const double* nodes, const double* inv_denom, float* w) {
  lagrange_weights(P, t, nodes, inv_denom, w);
}

}  // namespace

std::vector<std::complex<double>> tsne_fft_circular_convolution(
    const std::vector<std::complex<float>>& x, const std::vector<std::complex<float>>& kernel,
    int live, int keep) {
  const int M = static_cast<int>(x.size());
  if (M < 1 || kernel.size() != x.size() || live < 0 || live > M || keep < 0 || keep > M)
    throw std::invalid_argument("tsne_fft_circular_convolution: bad sizes");
  const StripFft fft(M);
  // The sequence in lane 0, lane l holding it times (l + 1): every lane is checked.
  std::vector<float> xr(static_cast<size_t>(M) * kLanes), xi(xr.size());
  std::vector<float> kr(xr.size()), ki(xr.size());
  for (int t = 0; t < M; ++t)
    for (int l = 0; l < kLanes; ++l) {
      const size_t at = static_cast<size_t>(t) * kLanes + l;
      // Beyond `live` the strip holds garbage: the pruned transform must not read it.
      xr[at] = t < live ? x[t].real() * (l + 1) : 1e30f;
      xi[at] = t < live ? x[t].imag() * (l + 1) : -1e30f;
      kr[at] = kernel[t].real();
      ki[at] = kernel[t].imag();
    }
  fft.forward(kr.data(), ki.data(), kLanes);
  fft.convolve(xr.data(), xi.data(), live, keep, kr.data(), ki.data());
  std::vector<std::complex<double>> out(static_cast<size_t>(keep) * kLanes);
  for (int t = 0; t < keep; ++t)
    for (int l = 0; l < kLanes; ++l) {
      const size_t at = static_cast<size_t>(t) * kLanes + l;
      out[static_cast<size_t>(l) * keep + t] =
          std::complex<double>(xr[at], xi[at]) / (double(M) * (l + 1));
    }
  return out;
}

namespace {

// The grid of one call: `boxes` boxes of side h per side, p x p nodes in each (N = boxes * p
// nodes per side, `spacing` apart), zero-padded to an FFT of side M; centred at (cx, cy), the
// centre of the embedding's bounding box, with its lower corner at (x0, y0).
struct GridLayout {
  int p, M, boxes, N;
  double h, inv_h, spacing, cx, cy, x0, y0;
};

GridLayout layout_grid(const TsneFftParams& params, const float* y, int n) {
  GridLayout g;
  g.p = params.nodes_per_box;
  const TsneBox bb = tsne_bounding_box(y, n);
  const double extent = std::max({bb.maxx - bb.minx, bb.maxy - bb.miny, 1e-6}) * (1 + 1e-9);

  // Boxes per side: enough for h <= max_box and at least min_boxes (FIt-SNE's
  // intervals_per_integer and min_num_intervals); then the smallest FFT side M with factors 2, 3
  // and 5 that holds N = boxes * p nodes without wrap-around in the circular convolution
  // (M >= 2N - 1), and as many boxes as that M allows (finer boxes at no extra cost).
  const int wanted =
      std::max(params.min_boxes, static_cast<int>(std::ceil(extent / params.max_box)));
  g.M = fft_friendly_size(2 * wanted * g.p - 1);
  g.boxes = (g.M + 1) / 2 / g.p;
  g.N = g.boxes * g.p;
  double h = extent / g.boxes;
  h = std::exp2(std::ceil(std::log2(h) * 32) / 32);  // quantised: the spectrum is reused
  g.h = h;
  g.inv_h = 1 / h;
  g.spacing = h / g.p;  // of the node lattice
  g.cx = (bb.minx + bb.maxx) / 2, g.cy = (bb.miny + bb.maxy) / 2;
  g.x0 = g.cx - g.boxes * h / 2, g.y0 = g.cy - g.boxes * h / 2;
  return g;
}

// The points in the order of their box's row (a counting sort): every per-point array of pts
// is kept in that order, so that spreading and interpolation sweep the nodes a few rows at a
// time and read the points' data sequentially. Boxes share no nodes, so the points of two
// disjoint ranges of box rows spread onto disjoint node rows: two threads spread two halves.
// Returns the box row that splits the points into those halves.
int sort_by_box_row(const float* y, int n, const GridLayout& g, PointsByBoxRow& pts) {
  const int boxes = g.boxes;
  pts.box_row.resize(n);
  pts.row_start.assign(static_cast<size_t>(boxes) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const int r = std::clamp(static_cast<int>((y[2 * i] - g.x0) * g.inv_h), 0, boxes - 1);
    pts.box_row[i] = r;
    ++pts.row_start[r + 1];
  }
  for (int r = 0; r < boxes; ++r) pts.row_start[r + 1] += pts.row_start[r];
  pts.row_fill.assign(pts.row_start.begin(), pts.row_start.end() - 1);
  pts.order.resize(n);
  for (int i = 0; i < n; ++i) pts.order[pts.row_fill[pts.box_row[i]]++] = i;
  return std::clamp(
      static_cast<int>(std::lower_bound(pts.row_start.begin(), pts.row_start.end(), n / 2) -
                       pts.row_start.begin()),
      0, boxes);
}

// The position (relative to the grid centre), Lagrange weights along x and y and first node
// of the point at every place o of that order.
void interpolation_weights(const float* y, int n, const GridLayout& g, PointsByBoxRow& pts) {
  const int p = g.p;
  double nodes[8], inv_denom[8];
  for (int k = 0; k < p; ++k) nodes[k] = (k + 0.5) / p;
  for (int k = 0; k < p; ++k) {
    double denom = 1;
    for (int l = 0; l < p; ++l)
      if (l != k) denom *= nodes[k] - nodes[l];
    inv_denom[k] = 1 / denom;
  }
  pts.pos.resize(2 * static_cast<size_t>(n));
  pts.wx.resize(static_cast<size_t>(n) * p);
  pts.wy.resize(static_cast<size_t>(n) * p);
  pts.gx.resize(n);
  pts.gy.resize(n);
  parallel_chunks(n, 4096, [&](int b, int e) {
    for (int o = b; o < e; ++o) {
      const int i = pts.order[o];
      pts.pos[2 * o] = y[2 * i] - g.cx;
      pts.pos[2 * o + 1] = y[2 * i + 1] - g.cy;
      for (int axis = 0; axis < 2; ++axis) {
        const double u = (y[2 * i + axis] - (axis ? g.y0 : g.x0)) * g.inv_h;
        const int box = axis ? std::clamp(static_cast<int>(u), 0, g.boxes - 1) : pts.box_row[i];
        const double t = u - box;
        float* w = (axis ? pts.wy.data() : pts.wx.data()) + static_cast<size_t>(o) * p;
        if (p == 3)  // FIt-SNE's default, unrolled
          lagrange_weights<3>(t, nodes, inv_denom, w);
        else
          lagrange_weights(p, t, nodes, inv_denom, w);
        (axis ? pts.gy : pts.gx)[o] = box * p;
      }
    }
  });
}

// The four charges of every node (1, y_x, y_y, |y|^2, relative to the grid centre),
// interleaved in q (N x N x 4): one 16-byte update per node and point. Two threads, on the box
// rows below and from split_row.
void spread_charges(const PointsByBoxRow& pts, const GridLayout& g, int split_row, float* q) {
  const int p = g.p, N = g.N;
  parallel_chunks(2, 1, [&](int hb, int he) {
    for (int half = hb; half < he; ++half) {
      const int r0 = half ? split_row : 0, r1 = half ? g.boxes : split_row;
      std::fill(q + static_cast<size_t>(r0) * p * N * 4, q + static_cast<size_t>(r1) * p * N * 4,
                0.f);
      for (int o = pts.row_start[r0]; o < pts.row_start[r1]; ++o) {
        const float px = static_cast<float>(pts.pos[2 * o]),
                    py = static_cast<float>(pts.pos[2 * o + 1]);
        const Vec4 charge = {1.f, px, py, px * px + py * py};
        const float* ux = &pts.wx[static_cast<size_t>(o) * p];
        const float* uy = &pts.wy[static_cast<size_t>(o) * p];
        for (int kx = 0; kx < p; ++kx) {
          float* node = q + (static_cast<size_t>(pts.gx[o] + kx) * N + pts.gy[o]) * 4;
          for (int ky = 0; ky < p; ++ky)
            store_vec4(node + 4 * ky, load_vec4(node + 4 * ky) + (ux[kx] * uy[ky]) * charge);
        }
      }
    }
  });
}

// The two grids are independent: one thread each takes its two charges of q as one complex
// grid (a: 1 + i y_x, b: y_y + i |y|^2; rows [N, M) need no zeros: the pruned transforms do not
// read them) and convolves it with the kernel.
void convolve_charges(const StripFft& fft, const std::vector<float>& kernel_hat, const float* q,
                      int M, int N, Grid& a, Grid& b) {
  parallel_chunks(2, 1, [&](int gb, int ge) {
    for (int which = gb; which < ge; ++which) {
      Grid& g = which == 0 ? a : b;
      if (g.rows != M) g.reset(M, N);
      for (int r = 0; r < N; ++r) {
        float* gr = &g.re[g.at(r, 0)];
        float* gi = &g.im[g.at(r, 0)];
        const float* qr = q + static_cast<size_t>(r) * N * 4 + 2 * which;
        for (int c = 0; c < N; ++c) gr[c] = qr[4 * c], gi[c] = qr[4 * c + 1];
        std::fill(gr + N, gr + g.ld, 0.f);  // the lanes of the last column strip
        std::fill(gi + N, gi + g.ld, 0.f);
      }
      convolve(fft, kernel_hat, g, M, N);
    }
  });
}

// The four potentials of every node, interleaved in q in place of the charges.
void interleave_potentials(const Grid& a, const Grid& b, int N, float* q) {
  parallel_chunks(N, 64, [&](int rb, int re) {
    for (int r = rb; r < re; ++r) {
      const float* ar = &a.re[a.at(r, 0)];
      const float* ai = &a.im[a.at(r, 0)];
      const float* br = &b.re[b.at(r, 0)];
      const float* bi = &b.im[b.at(r, 0)];
      float* qr = q + static_cast<size_t>(r) * N * 4;
      for (int c = 0; c < N; ++c)
        qr[4 * c] = ar[c], qr[4 * c + 1] = ai[c], qr[4 * c + 2] = br[c], qr[4 * c + 3] = bi[c];
    }
  });
}

// Interpolate the potentials of q back to the points (in box-row order); forces and Z_i from
// them.
void interpolate_to_points(const PointsByBoxRow& pts, const GridLayout& g, const float* q, int n,
                           double* rep, double* z_each) {
  const int p = g.p, N = g.N;
  parallel_chunks(n, 4096, [&](int b, int e) {
    for (int o = b; o < e; ++o) {
      const float* ux = &pts.wx[static_cast<size_t>(o) * p];
      const float* uy = &pts.wy[static_cast<size_t>(o) * p];
      Vec4d phi = {0, 0, 0, 0};
      for (int kx = 0; kx < p; ++kx) {
        const float* node = q + (static_cast<size_t>(pts.gx[o] + kx) * N + pts.gy[o]) * 4;
        for (int ky = 0; ky < p; ++ky)
          phi +=
              (double(ux[kx]) * uy[ky]) * __builtin_convertvector(load_vec4(node + 4 * ky), Vec4d);
      }
      const int i = pts.order[o];
      const double px = pts.pos[2 * o], py = pts.pos[2 * o + 1];
      rep[2 * i] = px * phi[0] - phi[1];
      rep[2 * i + 1] = py * phi[0] - phi[2];
      // The j = i term adds exactly 1 (w_ii = 1): taken out.
      z_each[i] = (1 + px * px + py * py) * phi[0] - 2 * (px * phi[1] + py * phi[2]) + phi[3] - 1;
    }
  });
}

}  // namespace

TsneFftRepulsion::Sums TsneFftRepulsion::compute(const float* y, int n) {
  State& st = *state_;
  st.rep.resize(2 * static_cast<size_t>(n));
  st.z_each.resize(n);
  double* rep = st.rep.data();
  double* z_each = st.z_each.data();
  const GridLayout g = layout_grid(params_, y, n);
  const int M = g.M, N = g.N;

  if (st.M != M) {
    st.fft = std::make_unique<StripFft>(M);
    st.M = M;
    st.spacing = 0;
  }
  const StripFft& fft = *st.fft;
  if (st.spacing != g.spacing || st.N != N) {
    st.kernel_hat = kernel_spectrum(fft, M, N, g.spacing);
    st.spacing = g.spacing;
    st.N = N;
    ++kernel_updates_;
  }

  const int split_row = sort_by_box_row(y, n, g, st.points);
  interpolation_weights(y, n, g, st.points);
  st.nodes.resize(static_cast<size_t>(N) * N * 4);
  float* q = st.nodes.data();
  spread_charges(st.points, g, split_row, q);
  convolve_charges(fft, st.kernel_hat, q, M, N, st.a, st.b);
  interleave_potentials(st.a, st.b, N, q);
  interpolate_to_points(st.points, g, q, n, rep, z_each);
  last_fft_side_ = M;
  last_box_ = g.h;
  return {rep, z_each};
}

}  // namespace kvscope
