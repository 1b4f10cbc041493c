// The CPU reference of the t-SNE gradient op (engine/ops/tsne_gradient.h): exact O(n^2) or
// Barnes-Hut repulsion, the FFT-interpolated variant (fft_tsne_gradient; the repulsion itself is
// engine/ops/tsne_gradient_fft.cpp), and the attraction and KL rows they share (the SIMD table's
// where it has them, engine/core/simd.h). TsneRun (engine/geometry/tsne.cpp) calls it through the
// backend; the CUDA kernel (kernels/tsne_gradient.cu) is tested against it
// (tests/test_cuda_parity.cpp). Moved here from engine/geometry/tsne.cpp unchanged.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/core/simd.h"
#include "engine/core/thread_pool.h"
#include "engine/ops/backend.h"
#include "engine/ops/tsne_box.h"
#include "engine/ops/tsne_gradient.h"
#include "engine/ops/tsne_gradient_fft.h"

namespace kvscope {
namespace {

// ---- Barnes-Hut quadtree --------------------------------------------------------------------

// Cells are stored in depth-first pre-order, so the traversal is a forward scan: a cell that is
// summarised (or a leaf) is stepped over to `skip`, the index just past its subtree; a cell that
// is opened continues at the next index, its first child. Only non-empty cells are stored.
struct QuadNode {
  float comx, comy;  // centre of mass of its points
  float side2;       // (side length)^2, for the opening test
  int count;
  int skip;        // first index after this cell's subtree; index + 1 for a leaf
  int begin, end;  // its points: positions [begin, end) of the tree order
  int pad_;        // to 32 bytes: two cells per cache line
};

// A point quadtree over the embedding, rebuilt every iteration (O(n log n)). Leaves hold up to
// kLeafSize points, summed directly: cheaper than descending to single points. The points are
// also copied in tree order (px_, py_), so a leaf's points are contiguous.
class QuadTree {
 public:
  QuadTree(const float* y, int n) : y_(y) {
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
    const auto [minx, maxx, miny, maxy] = tsne_bounding_box(y, n);
    const double half = std::max({maxx - minx, maxy - miny, 1e-12}) / 2 * (1 + 1e-6);
    nodes_.reserve(static_cast<size_t>(n) / 2 + 64);
    scratch_.resize(n);
    build(static_cast<float>((minx + maxx) / 2), static_cast<float>((miny + maxy) / 2),
          static_cast<float>(half), 0, n, 0);
    px_.resize(n);
    py_.resize(n);
    for (int k = 0; k < n; ++k) {
      px_[k] = y[2 * order_[k]];
      py_[k] = y[2 * order_[k] + 1];
    }
  }

  // The point at position k of the tree order.
  int point(int k) const { return order_[k]; }

  // Repulsive force sum_j q_ij^2 (y_i - y_j) and sum_j q_ij (q = 1/(1 + |y_i - y_j|^2)) for
  // the point at tree position k, summarising a cell by its centre of mass when
  // side / distance < theta.
  void repulsion(int k, double theta, double& fx, double& fy, double& z) const {
    const float xi = px_[k], yi = py_[k];
    const float theta2 = static_cast<float>(theta * theta);
    const QuadNode* nodes = nodes_.data();
    const float* px = px_.data();
    const float* py = py_.data();
    const int count = static_cast<int>(nodes_.size());
    int at = 0;
    while (at < count) {
      const QuadNode& nd = nodes[at];
      if (nd.skip == at + 1) {
        // A leaf: every point but k itself.
        auto direct = [&](int b, int e) {
          for (int m = b; m < e; ++m) {
            const double dx = xi - px[m], dy = yi - py[m];
            const double q = 1.0 / (1.0 + dx * dx + dy * dy);
            const double q2 = q * q;
            z += q;
            fx += q2 * dx;
            fy += q2 * dy;
          }
        };
        if (k >= nd.begin && k < nd.end) {
          direct(nd.begin, k);
          direct(k + 1, nd.end);
        } else {
          direct(nd.begin, nd.end);
        }
        at = nd.skip;
        continue;
      }
      const float dxf = xi - nd.comx, dyf = yi - nd.comy;
      const float dist2 = dxf * dxf + dyf * dyf;
      if (nd.side2 < theta2 * dist2) {
        const double q = 1.0 / (1.0 + double(dist2));
        z += nd.count * q;
        fx += nd.count * q * q * dxf;
        fy += nd.count * q * q * dyf;
        at = nd.skip;
      } else {
        ++at;
      }
    }
  }

 private:
  static constexpr int kMaxDepth = 40;
  static constexpr int kLeafSize = 8;

  // Appends the cell (centre cx, cy, half side h) holding order_[begin, end) and its subtree.
  void build(float cx, float cy, float h, int begin, int end, int depth) {
    double sx = 0, sy = 0;
    for (int k = begin; k < end; ++k) {
      sx += y_[2 * order_[k]];
      sy += y_[2 * order_[k] + 1];
    }
    const int node = static_cast<int>(nodes_.size());
    QuadNode nd{};
    nd.begin = begin;
    nd.end = end;
    nd.count = end - begin;
    nd.comx = static_cast<float>(sx / nd.count);
    nd.comy = static_cast<float>(sy / nd.count);
    nd.side2 = static_cast<float>(4.0 * double(h) * double(h));
    nd.skip = node + 1;
    nodes_.push_back(nd);
    // Leaves: few points, or coincident points (depth cap).
    if (nd.count <= kLeafSize || depth >= kMaxDepth) return;
    // Counting sort of order_[begin, end) into the quadrants SW, SE, NW, NE (stable).
    auto quadrant = [&](int idx) {
      return (y_[2 * idx] >= cx ? 1 : 0) + (y_[2 * idx + 1] >= cy ? 2 : 0);
    };
    int counts[4] = {0, 0, 0, 0};
    for (int k = begin; k < end; ++k) ++counts[quadrant(order_[k])];
    int bounds[5] = {begin, 0, 0, 0, end};
    for (int c = 0; c < 3; ++c) bounds[c + 1] = bounds[c] + counts[c];
    int fill[4] = {bounds[0], bounds[1], bounds[2], bounds[3]};
    for (int k = begin; k < end; ++k) scratch_[fill[quadrant(order_[k])]++] = order_[k];
    std::copy(scratch_.begin() + begin, scratch_.begin() + end, order_.begin() + begin);
    const float hh = h / 2;
    for (int c = 0; c < 4; ++c)
      if (bounds[c] < bounds[c + 1])
        build(cx + ((c & 1) ? hh : -hh), cy + ((c & 2) ? hh : -hh), hh, bounds[c], bounds[c + 1],
              depth + 1);
    nodes_[node].skip = static_cast<int>(nodes_.size());
  }

  const float* y_;
  std::vector<int> order_, scratch_;
  std::vector<float> px_, py_;
  std::vector<QuadNode> nodes_;
};

}  // namespace

// ---- the gradient (CPU reference behind Backend::tsne_gradient) -----------------------------

// dC/dy_i = 4 (exaggeration * sum_j p_ij q_ij Zq (y_i - y_j) - sum_j q_ij^2 Z (y_i - y_j)) with
// unnormalised q_ij = 1 / (1 + |y_i - y_j|^2) and Z = sum_{k != l} q_kl; all sums in double.
// Returns KL(P || Q) of the un-exaggerated P (with the Barnes-Hut estimate of Z when theta > 0),
// or NaN when !in.want_kl (the logs cost as much as the forces).
namespace {
// The attractive term and the assembly of the gradient from repulsive sums rep (2n: sum_j
// w_ij^2 (y_i - y_j)) and zi (n: sum_{j != i} w_ij), shared by every repulsion method.
double finish_gradient(const TsneGradInput& in, const double* rep, const double* zi, float* grad);
}  // namespace

double cpu_tsne_gradient(const TsneGradInput& in, float* grad) {
  const int n = in.n;
  if (n <= 0) return 0;
  const float* y = in.y;
  std::vector<double> rep(2 * static_cast<size_t>(n));
  std::vector<double> zi(n);

  if (in.theta > 0) {
    const QuadTree tree(y, n);
    // In tree order, so consecutive points walk nearly the same cells.
    parallel_chunks(n, 512, [&](int b, int e) {
      for (int k = b; k < e; ++k) {
        const int i = tree.point(k);
        double fx = 0, fy = 0, z = 0;
        tree.repulsion(k, in.theta, fx, fy, z);
        rep[2 * i] = fx;
        rep[2 * i + 1] = fy;
        zi[i] = z;
      }
    });
  } else {
    parallel_chunks(n, 128, [&](int b, int e) {
      for (int i = b; i < e; ++i) {
        const double xi = y[2 * i], yi = y[2 * i + 1];
        // No j != i branch, and four independent partial sums (combined in a fixed order), so
        // the compiler can keep several divisions in flight: the self term adds exactly q = 1
        // to z and nothing to the force, and is taken back out below.
        double fx[4] = {0, 0, 0, 0}, fy[4] = {0, 0, 0, 0}, z[4] = {0, 0, 0, 0};
        int j = 0;
        for (; j + 4 <= n; j += 4) {
          for (int l = 0; l < 4; ++l) {
            const double dx = xi - y[2 * (j + l)], dy = yi - y[2 * (j + l) + 1];
            const double q = 1.0 / (1.0 + dx * dx + dy * dy);
            z[l] += q;
            fx[l] += q * q * dx;
            fy[l] += q * q * dy;
          }
        }
        for (; j < n; ++j) {
          const double dx = xi - y[2 * j], dy = yi - y[2 * j + 1];
          const double q = 1.0 / (1.0 + dx * dx + dy * dy);
          z[0] += q;
          fx[0] += q * q * dx;
          fy[0] += q * q * dy;
        }
        rep[2 * i] = (fx[0] + fx[1]) + (fx[2] + fx[3]);
        rep[2 * i + 1] = (fy[0] + fy[1]) + (fy[2] + fy[3]);
        zi[i] = (z[0] + z[1]) + (z[2] + z[3]) - 1.0;
      }
    });
  }

  return finish_gradient(in, rep.data(), zi.data(), grad);
}

double fft_tsne_gradient(const TsneGradInput& in, float* grad, TsneFftRepulsion& repulsion) {
  const int n = in.n;
  if (n <= 0) return 0;
  const TsneFftRepulsion::Sums sums = repulsion.compute(in.y, n);
  return finish_gradient(in, sums.rep, sums.z_each, grad);
}

namespace {

// log(x) for a normal float x > 0, to about 2e-7 relative, in plain arithmetic the compiler
// vectorises (no libm call): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s),
// s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^9.
inline float vector_log(float x) {
  int32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  int32_t e = ((bits >> 23) & 0xff) - 127;
  bits = (bits & 0x007fffff) | 0x3f800000;
  float m;
  std::memcpy(&m, &bits, sizeof m);
  const bool high = m > 1.41421356f;
  m = high ? m * 0.5f : m;
  e = high ? e + 1 : e;
  const float s = (m - 1) / (m + 1), s2 = s * s;
  const float series = 1 + s2 * (1.f / 3 + s2 * (1.f / 5 + s2 * (1.f / 7 + s2 * (1.f / 9))));
  return static_cast<float>(e) * 0.693147180559945f + 2 * s * series;
}

constexpr int kLanes = 8;  // independent partial sums per row (vectorised without reassociation)

// The attraction of row i, sum_j p_ij (y_i - y_j) / (1 + |y_i - y_j|^2), in float with kLanes
// independent partial sums combined in double in a fixed order. The portable path: kept scalar
// on purpose, because GCC vectorises this loop with gathered loads of y_j, which measured
// 1.5-2x slower than scalar loads on the development CPU (AMD Zen 3; isolated microbenchmark of
// 32k rows x 138 entries, 13-15 ms vs 6-8 ms). The SIMD table's tsne_row_terms is the fast path.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((noinline, optimize("no-tree-vectorize")))
#endif
void attraction_portable(const TsneGradInput& in, int i, double& fx, double& fy) {
  const float* y = in.y;
  const int* col = in.p_col;
  const float* val = in.p_val;
  const float xi = y[2 * i], yi = y[2 * i + 1];
  float ax[kLanes] = {}, ay[kLanes] = {};
  int k = in.p_rowptr[i];
  const int end = in.p_rowptr[i + 1];
  auto term = [&](int at, int l) {
    const int j = col[at];
    const float dx = xi - y[2 * j], dy = yi - y[2 * j + 1];
    const float pq = val[at] / (1.f + dx * dx + dy * dy);
    ax[l] += pq * dx;
    ay[l] += pq * dy;
  };
  for (; k + kLanes <= end; k += kLanes)
    for (int l = 0; l < kLanes; ++l) term(k + l, l);
  for (int l = 0; k < end; ++k, ++l) term(k, l);
  fx = 0, fy = 0;
  for (int l = 0; l < kLanes; ++l) fx += ax[l], fy += ay[l];
}

// Row i's part of the KL divergence, sum_j p_ij log(p_ij (1 + |y_i - y_j|^2)), and sum_j p_ij.
inline void kl_row_portable(const TsneGradInput& in, int i, double& kl, double& ps) {
  const float* y = in.y;
  const float xi = y[2 * i], yi = y[2 * i + 1];
  float akl[kLanes] = {}, aps[kLanes] = {};
  int k = in.p_rowptr[i];
  const int end = in.p_rowptr[i + 1];
  auto term = [&](int at, int l) {
    const int j = in.p_col[at];
    const float p = in.p_val[at];
    const float dx = xi - y[2 * j], dy = yi - y[2 * j + 1];
    // p log p -> 0 as p -> 0; below 1e-30 (or a denormal) the term is dropped.
    const float pd = p > 1e-30f ? p * (1.f + dx * dx + dy * dy) : 1.f;
    akl[l] += p > 1e-30f ? p * vector_log(pd) : 0.f;
    aps[l] += p;
  };
  for (; k + kLanes <= end; k += kLanes)
    for (int l = 0; l < kLanes; ++l) term(k + l, l);
  for (int l = 0; k < end; ++k, ++l) term(k, l);
  kl = 0, ps = 0;
  for (int l = 0; l < kLanes; ++l) kl += akl[l], ps += aps[l];
}

std::atomic<bool> g_tsne_simd{true};

// The SIMD table's rows (engine/core/simd.h tsne_row_terms: AVX2, 8 neighbours per step, also in
// the avx512 table) when it has them and set_cpu_tsne_simd has not turned them off; null otherwise.
// Asked once per gradient, not per row.
decltype(simd::Kernels::tsne_row_terms) simd_row_terms() {
  if (!g_tsne_simd.load(std::memory_order_relaxed)) return nullptr;
  return simd::kernels().tsne_row_terms;
}

// Row i's attraction, and with kl/ps its part of the KL divergence and sum_j p_ij: the SIMD rows
// (the same float terms; the sums associate differently, so results agree with the portable ones
// to float rounding, not bit for bit) when `rows` is not null, else the portable ones.
void row_terms(const TsneGradInput& in, decltype(simd::Kernels::tsne_row_terms) rows, int i,
               double& fx, double& fy, double* kl, double* ps) {
  if (rows) return rows(in.y, in.p_rowptr, in.p_col, in.p_col16, in.p_val, i, &fx, &fy, kl, ps);
  attraction_portable(in, i, fx, fy);
  if (kl) kl_row_portable(in, i, *kl, *ps);
}

double finish_gradient(const TsneGradInput& in, const double* rep, const double* zi, float* grad) {
  const int n = in.n;
  double z = 0;
  for (int i = 0; i < n; ++i) z += zi[i];
  z = std::max(z, std::numeric_limits<double>::min());
  // Attractive forces over the sparse P and the gradient, and (when asked) the per-row pieces of
  // the KL divergence: KL = sum p log p - sum p log q_unnorm + (sum p) log Z =
  // sum p log(p (1 + d^2)) + (sum p) log Z, rows summed afterwards in index order.
  const bool want_kl = in.want_kl;
  std::vector<double> kl_terms(want_kl ? n : 0), psum(want_kl ? n : 0);
  const double exaggeration = in.exaggeration;
  const auto rows = simd_row_terms();
  parallel_chunks(n, 512, [&](int b, int e) {
    for (int i = b; i < e; ++i) {
      double fx, fy;
      row_terms(in, rows, i, fx, fy, want_kl ? &kl_terms[i] : nullptr,
                want_kl ? &psum[i] : nullptr);
      grad[2 * i] = static_cast<float>(4.0 * (exaggeration * fx - rep[2 * i] / z));
      grad[2 * i + 1] = static_cast<float>(4.0 * (exaggeration * fy - rep[2 * i + 1] / z));
    }
  });
  if (!want_kl) return std::numeric_limits<double>::quiet_NaN();
  double kl = 0, ptotal = 0;
  for (int i = 0; i < n; ++i) {
    kl += kl_terms[i];
    ptotal += psum[i];
  }
  return kl + ptotal * std::log(z);
}
}  // namespace

bool set_cpu_tsne_simd(bool enabled) {
  return g_tsne_simd.exchange(enabled);
}

bool cpu_tsne_avx2_in_use() {
  return simd_row_terms() != nullptr;
}

OpShape op_shape(const TsneGradInput& in) {
  return {Op::tsne_gradient, in.n, 2, 0, 0, false};
}

}  // namespace kvscope
