#include "engine/geometry/knn.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <nanoflann.hpp>
#include <new>
#include <string>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/simd.h"
#include "engine/core/thread_pool.h"

namespace kvscope {
namespace {

bool is_set(const std::atomic<bool>* flag) {
  return flag && flag->load(std::memory_order_relaxed);
}

struct Candidate {
  float d;
  int j;
};
// The order of the result: distance, then index.
inline bool before(const Candidate& a, const Candidate& b) {
  return a.d < b.d || (a.d == b.d && a.j < b.j);
}

// The distance of rank `rank` (0-based) among c[0..count): a quickselect whose partition passes
// are branch-free (candidates arrive in no useful order, so the branches of std::nth_element's
// partition mispredict about half the time; on the 32k run this halved the cost of the cuts).
float kth_distance(const Candidate* c, int count, int rank, std::vector<float>& scratch) {
  scratch.resize(3 * static_cast<size_t>(count));
  float* a = scratch.data();
  float* lt = a + count;
  float* gt = lt + count;
  for (int r = 0; r < count; ++r) a[r] = c[r].d;
  int n = count;
  while (n > 16) {
    const float x0 = a[0], x1 = a[n / 2], x2 = a[n - 1];
    const float pivot = std::max(std::min(x0, x1), std::min(std::max(x0, x1), x2));
    int nl = 0, ng = 0;
    for (int r = 0; r < n; ++r) {
      const float x = a[r];
      lt[nl] = x;
      gt[ng] = x;
      nl += x < pivot;
      ng += x > pivot;
    }
    if (rank < nl) {
      std::swap(a, lt);
      n = nl;
    } else if (rank >= n - ng) {
      rank -= n - ng;
      std::swap(a, gt);
      n = ng;
    } else {
      return pivot;
    }
  }
  std::nth_element(a, a + rank, a + n);
  return a[rank];
}

// Moves the candidates of c[0..count) at most `limit` away to the front; returns how many.
int keep_within(Candidate* c, int count, float limit) {
  int w = 0;
  for (int r = 0; r < count; ++r) {
    const Candidate x = c[r];
    c[w] = x;
    w += x.d <= limit;
  }
  return w;
}

// For every point, the candidates that may still be among its k nearest: an unordered buffer of
// `capacity` (> k) slots. An offer that beats the point's threshold is appended (a store, where a
// bounded heap took a sift of log k unpredictable steps through cache lines of other points); a
// full buffer is cut back to the candidates at most its k-th distance away (k of them, unless
// some tie with the k-th), and the threshold becomes that distance. The threshold starts at +inf
// or at a sampled estimate (set_threshold) and only comes down; offers equal to it are kept, so
// ties are settled by index at the end. `threshold` has `slots` >= n entries so that padded
// columns of a tile can read theirs.
class NearestSets {
 public:
  NearestSets(int n, int slots, int k, int capacity)
      : k_(k),
        capacity_(capacity),
        buffer_(new Candidate[static_cast<size_t>(n) * capacity]),  // not zeroed: written first
        size_(n, 0),
        threshold_(slots, std::numeric_limits<float>::infinity()) {}

  void offer(int i, float d, int j) {
    if (d > threshold_[i]) return;
    Candidate* b = &buffer_[static_cast<size_t>(i) * capacity_];
    int& s = size_[i];
    b[s++] = Candidate{d, j};
    if (s == k_) {
      // The first k: their farthest bounds the k-th distance.
      float worst = b[0].d;
      for (int r = 1; r < k_; ++r) worst = std::max(worst, b[r].d);
      threshold_[i] = std::min(threshold_[i], worst);
    } else if (s == capacity_) {
      cut(i);
    }
  }
  // Cuts a full buffer back to what is at most its k-th distance away.
  void cut(int i) {
    Candidate* b = &buffer_[static_cast<size_t>(i) * capacity_];
    const float kth = kth_distance(b, capacity_, k_ - 1, scratch_);
    int kept = keep_within(b, capacity_, kth);
    if (kept > (k_ + capacity_) / 2) {
      // Many ties with the k-th (duplicated points): keep the k first by (distance, index).
      std::nth_element(b, b + k_ - 1, b + kept, before);
      kept = k_;
    }
    size_[i] = kept;
    threshold_[i] = kth;
  }
  const float* threshold() const { return threshold_.data(); }
  void set_threshold(int i, float t) { threshold_[i] = t; }
  // The kept candidates of point i (unordered; the k first among them are its k nearest).
  Candidate* begin(int i) { return &buffer_[static_cast<size_t>(i) * capacity_]; }
  int size(int i) const { return size_[i]; }

 private:
  int k_, capacity_;
  std::unique_ptr<Candidate[]> buffer_;
  std::vector<int> size_;
  std::vector<float> threshold_;
  std::vector<float> scratch_;
};

struct RowsAdaptor {
  const MatrixF& m;
  size_t kdtree_get_point_count() const { return static_cast<size_t>(m.rows()); }
  float kdtree_get_pt(size_t idx, size_t dim) const {
    return m(static_cast<Eigen::Index>(idx), static_cast<Eigen::Index>(dim));
  }
  template <class BBox>
  bool kdtree_get_bbox(BBox&) const {
    return false;
  }
};

// `cand` holds at least k candidates of row i, unordered: the k first by (distance, index).
void write_row(int i, int k, Candidate* cand, int count, std::vector<int>& neighbours,
               std::vector<float>& dist2, std::vector<float>& scratch) {
  if (count > k) count = keep_within(cand, count, kth_distance(cand, count, k - 1, scratch));
  std::sort(cand, cand + count, before);
  for (int r = 0; r < k; ++r) {
    neighbours[static_cast<size_t>(i) * k + r] = cand[r].j;
    dist2[static_cast<size_t>(i) * k + r] = std::max(0.f, cand[r].d);
  }
}

void knn_kdtree(const MatrixF& x, int k, std::vector<int>& neighbours, std::vector<float>& dist2,
                const std::atomic<bool>* cancel) {
  const int n = static_cast<int>(x.rows());
  const int d = static_cast<int>(x.cols());
  RowsAdaptor adaptor{x};
  using Tree = nanoflann::KDTreeSingleIndexAdaptor<nanoflann::L2_Simple_Adaptor<float, RowsAdaptor>,
                                                   RowsAdaptor, -1, uint32_t>;
  Tree tree(d, adaptor, nanoflann::KDTreeSingleIndexAdaptorParams(16));
  parallel_chunks(n, 256, [&](int b, int e) {
    std::vector<uint32_t> idx(k + 1);
    std::vector<float> dd(k + 1);
    std::vector<Candidate> cand;
    std::vector<float> scratch;
    for (int i = b; i < e; ++i) {
      if ((i & 255) == 0 && is_set(cancel)) return;
      const size_t found = tree.knnSearch(x.row(i).data(), k + 1, idx.data(), dd.data());
      cand.clear();
      // The point itself is dropped (found among the k + 1 unless k + 1 duplicates tie with it).
      for (size_t r = 0; r < found; ++r)
        if (static_cast<int>(idx[r]) != i) cand.push_back({dd[r], static_cast<int>(idx[r])});
      write_row(i, k, cand.data(), static_cast<int>(cand.size()), neighbours, dist2, scratch);
    }
  });
}

// ---- brute force -----------------------------------------------------------------------------

constexpr int kBlock = 512;  // rows and columns of a tile (a multiple of kPanel)
// The layout of the SIMD table's kNN kernels (engine/core/simd.h KnnPoints).
constexpr int kPanel = simd::kKnnPanel;  // columns of a packed panel: two AVX2 vectors
constexpr int kRows = simd::kKnnRows;    // rows of the register block (6 x 16 accumulators)

// 64-byte aligned float storage.
struct AlignedDelete {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using AlignedFloats = std::unique_ptr<float[], AlignedDelete>;
AlignedFloats aligned_floats(size_t count) {
  float* p = static_cast<float*>(::operator new[](count * sizeof(float), std::align_val_t(64)));
  std::fill(p, p + count, 0.f);
  return AlignedFloats(p);
}

// The points twice: row-major with kRows rows of zero padding (the register block reads rows past
// the last one), and as panels of kPanel columns, dimension-major (panel p holds, for each
// dimension c, points 16p .. 16p + 15), zero-padded to whole tiles. Squared norms are NaN past n
// so every padded distance is NaN and fails every compare.
struct Points {
  int n = 0, d = 0, padded = 0;
  AlignedFloats rows, panels, norms;
};

Points pack_points(const MatrixF& x) {
  Points p;
  p.n = static_cast<int>(x.rows());
  p.d = static_cast<int>(x.cols());
  p.padded = (p.n + kBlock - 1) / kBlock * kBlock;
  const size_t d = p.d;
  p.rows = aligned_floats((static_cast<size_t>(p.n) + kRows) * d);
  p.panels = aligned_floats(static_cast<size_t>(p.padded) * d);
  p.norms = aligned_floats(static_cast<size_t>(p.padded) + kRows);
  for (int i = 0; i < p.padded + kRows; ++i) p.norms[i] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 0; i < p.n; ++i) {
    const auto src = x.row(i);
    std::copy(src.data(), src.data() + d, p.rows.get() + i * d);
    float* panel = p.panels.get() + static_cast<size_t>(i / kPanel) * kPanel * d + i % kPanel;
    for (size_t c = 0; c < d; ++c) panel[c * kPanel] = src(static_cast<Eigen::Index>(c));
    p.norms[i] = src.squaredNorm();
  }
  return p;
}

// Offers the pairs (i, j0 + c), c < 16, whose bits are set: those in `for_row` to point i, those
// in `for_col` to the points j0 + c.
inline void offer_masked(NearestSets& sets, int i, int j0, const float* dd, unsigned for_row,
                         unsigned for_col) {
  while (for_row) {
    const int c = __builtin_ctz(for_row);
    for_row &= for_row - 1;
    sets.offer(i, dd[c], j0 + c);
  }
  while (for_col) {
    const int c = __builtin_ctz(for_col);
    for_col &= for_col - 1;
    sets.offer(j0 + c, dd[c], i);
  }
}

// The distances of one tile: rows [i0, i1) against columns [j0, j1) (j1 - j0 a multiple of
// kPanel; columns past n are padding), only j > i on the diagonal tile. Each is offered to both
// points when it beats either one's current k-th distance.
// Portable: the tile's Gram block by an Eigen float GEMM, then one pass over it (the SIMD table's
// knn_scan_tile where it has one).
void scan_tile_portable(const Points& p, int i0, int i1, int j0, int j1, NearestSets& sets,
                        MatrixF& scratch) {
  const bool diagonal = i0 == j0;
  const int cols = std::min(j1, p.n) - j0;
  using RowMap = Eigen::Map<const MatrixF>;
  const RowMap a(p.rows.get() + static_cast<size_t>(i0) * p.d, i1 - i0, p.d);
  const RowMap b(p.rows.get() + static_cast<size_t>(j0) * p.d, cols, p.d);
  scratch.resize(kBlock, kBlock);
  auto tile = scratch.topLeftCorner(i1 - i0, cols);
  tile.noalias() = a * b.transpose();
  const float* nj = p.norms.get() + j0;
  for (int i = i0; i < i1; ++i) {
    const float* row = &scratch(i - i0, 0);
    const float ni = p.norms[i];
    for (int b0 = diagonal ? (i + 1 - j0) / kPanel * kPanel : 0; b0 < cols; b0 += kPanel) {
      const int len = std::min(kPanel, cols - b0);
      const float wi = sets.threshold()[i];
      const float* wj = sets.threshold() + j0 + b0;
      float dd[kPanel];
      unsigned for_row = 0, for_col = 0;
      for (int c = 0; c < len; ++c) {
        dd[c] = ni + nj[b0 + c] - 2.f * row[b0 + c];
        const bool above = !diagonal || j0 + b0 + c > i;
        for_row |= unsigned(above && dd[c] <= wi) << c;
        for_col |= unsigned(above && dd[c] <= wj[c]) << c;
      }
      if (for_row | for_col) offer_masked(sets, i, j0 + b0, dd, for_row, for_col);
    }
  }
}

// Sampled thresholds. With thresholds that start at +inf, a point's threshold comes down as
// candidates arrive, and until it is near the final k-th distance most candidates pass it: on
// the 32k synthetic head (keys with little order) about 10 k candidates per point entered the
// buffers, each costing far more than its distance, and the buffers were cut 290 000 times. So
// every point first gets an estimate of its k-th distance from a strided sample of
// m = kSampleHits n / k points (the same register-block kernel; 2m/n = 12/k of the sweep's
// multiply-adds, 13% at k = 91): the distance of rank kSampleRank among the sample, within which
// lie about kSampleRank / kSampleHits x k = 2.3 k points. Offers beyond it are rejected from the
// start (about 7 M candidates entered the buffers instead of 31 M, 5 000 cuts).
// The estimate is not a bound, so it is checked: a point whose buffers end with k or more
// candidates has its exact k nearest among them (everything rejected was farther than k kept
// ones); a point with fewer is recomputed against all others (rare: a Poisson count of mean
// kSampleHits has to reach kSampleRank; 19 of the 32768 points).
constexpr double kSampleHits = 6;  // expected sample points within the true k-th distance
constexpr int kSampleRank = 14;    // P(Poisson(6) >= 14) = 0.4%: points recomputed

// The sample, packed like the points: panels of kPanel sample points, NaN norms and row -1
// past the last.
struct Sample {
  int padded = 0;
  AlignedFloats panels, norms;
  std::vector<int> row;
};

// The points as the SIMD table's kNN kernels read them.
simd::KnnPoints view(const Points& p) {
  return {p.n, p.d, p.rows.get(), p.panels.get(), p.norms.get()};
}

// offer_masked for the SIMD table's tile kernel (knn_scan_tile).
void offer_to(void* sets, int i, int j0, const float* dd, unsigned for_row, unsigned for_col) {
  offer_masked(*static_cast<NearestSets*>(sets), i, j0, dd, for_row, for_col);
}

// Estimated k-th distances of every point (see kSampleHits), or empty where a sample is not worth
// it (small n: it would be a large share of the work) or the SIMD table has no kNN kernels (the
// recomputation of a point, knn_distances, matches their arithmetic only).
std::vector<float> sampled_thresholds(const Points& p, int k, const simd::Kernels& kern,
                                      const std::atomic<bool>* cancel) {
  static_assert(kSampleRank <= simd::kKnnMaxRank, "knn_sample_ranks keeps at most kKnnMaxRank");
  const int n = p.n, d = p.d;
  const int m = static_cast<int>(std::ceil(kSampleHits * n / k));
  if (!kern.knn_scan_tile || !kern.knn_sample_ranks || !kern.knn_distances || n < 4096 ||
      8 * m > n || m <= 2 * kSampleRank)
    return {};
  Sample s;
  s.padded = (m + kPanel - 1) / kPanel * kPanel;
  s.panels = aligned_floats(static_cast<size_t>(s.padded) * d);
  s.norms = aligned_floats(s.padded);
  s.row.assign(s.padded, -1);
  for (int t = 0; t < s.padded; ++t) {
    s.norms[t] = std::numeric_limits<float>::quiet_NaN();
    if (t >= m) continue;
    // Sample t is row t * n / m (the stride keeps it spread over a capture's positions).
    const int i = static_cast<int>(static_cast<int64_t>(t) * n / m);
    s.row[t] = i;
    s.norms[t] = p.norms[i];
    float* panel = s.panels.get() + static_cast<size_t>(t / kPanel) * kPanel * d + t % kPanel;
    for (int c = 0; c < d; ++c) panel[c * kPanel] = p.rows[static_cast<size_t>(i) * d + c];
  }
  std::vector<float> estimate(n);
  const simd::KnnPoints points = view(p);
  const simd::KnnPoints sample{s.padded, d, nullptr, s.panels.get(), s.norms.get()};
  const int groups = (n + kRows - 1) / kRows;
  parallel_chunks(groups, 64, [&](int gb, int ge) {
    for (int g = gb; g < ge; g += 64) {
      if (is_set(cancel)) return;
      kern.knn_sample_ranks(points, sample, s.row.data(), kSampleRank, g * kRows,
                            std::min(n, std::min(ge, g + 64) * kRows), estimate.data());
    }
  });
  return estimate;
}

void knn_brute_force(const MatrixF& x, int k, std::vector<int>& neighbours,
                     std::vector<float>& dist2, const std::atomic<bool>* cancel) {
  const int n = static_cast<int>(x.rows());
  const Points points = pack_points(x);
  // The SIMD table's tile kernel where it has one (engine/core/simd.h, KVSCOPE_SIMD: AVX2 + FMA, a
  // 6 x 16 register block whose distances are compared while still in registers), else the portable
  // one.
  const simd::Kernels& kern = simd::kernels();
  const simd::KnnPoints packed = view(points);
  const int blocks = points.padded / kBlock;
  // Tiles (I, J), J >= I, diagonal first, then by distance from it: neighbouring tokens of a
  // capture tend to be near in key space too, so thresholds come down early (without a sampled
  // estimate; a median-split ordering of the points, tried instead, let more candidates in).
  std::vector<std::pair<int, int>> tiles;
  for (int gap = 0; gap < blocks; ++gap)
    for (int bi = 0; bi + gap < blocks; ++bi) tiles.emplace_back(bi, bi + gap);
  const int threads = chunk_threads(static_cast<int>(tiles.size()), 8);
  std::vector<NearestSets> sets;
  sets.reserve(threads);
  for (int t = 0; t < threads; ++t) sets.emplace_back(n, points.padded + kPanel, k, 2 * k);
  const std::vector<float> estimate = sampled_thresholds(points, k, kern, cancel);
  if (is_set(cancel)) return;
  for (int i = 0; i < static_cast<int>(estimate.size()); ++i)
    for (NearestSets& s : sets) s.set_threshold(i, estimate[i]);
  // Threads take the next tile as they finish one, so both stay busy to the end. Each pair is
  // seen by exactly one thread, nothing a thread drops can be among the k nearest, and the final
  // ranking is by (distance, index): the result does not depend on the schedule.
  std::atomic<size_t> next{0};
  parallel_chunks(threads, 1, [&](int tb, int te) {
    MatrixF scratch;
    for (int t = tb; t < te; ++t) {
      for (size_t at = next.fetch_add(1); at < tiles.size(); at = next.fetch_add(1)) {
        if (is_set(cancel)) return;
        const int i0 = tiles[at].first * kBlock, i1 = std::min(n, i0 + kBlock);
        const int j0 = tiles[at].second * kBlock, j1 = j0 + kBlock;
        if (kern.knn_scan_tile)
          kern.knn_scan_tile(packed, i0, i1, j0, j1, sets[t].threshold(), offer_to, &sets[t]);
        else
          scan_tile_portable(points, i0, i1, j0, j1, sets[t], scratch);
      }
    }
  });
  if (is_set(cancel)) return;
  parallel_chunks(n, 1024, [&](int b, int e) {
    std::vector<Candidate> cand;
    std::vector<float> scratch, all;
    for (int i = b; i < e; ++i) {
      if (threads == 1 && sets[0].size(i) >= k) {
        write_row(i, k, sets[0].begin(i), sets[0].size(i), neighbours, dist2, scratch);
        continue;
      }
      cand.clear();
      for (NearestSets& s : sets) cand.insert(cand.end(), s.begin(i), s.begin(i) + s.size(i));
      // Fewer than k within the sampled estimate (only with the SIMD kernels): it was too tight
      // for this point, which is recomputed against every other, exactly as the tile kernel
      // computes a distance.
      if (static_cast<int>(cand.size()) < k && kern.knn_distances) {
        all.resize(points.padded);
        kern.knn_distances(packed, i, all.data());
        cand.clear();
        for (int j = 0; j < n; ++j)
          if (j != i) cand.push_back({all[j], j});
      }
      write_row(i, k, cand.data(), static_cast<int>(cand.size()), neighbours, dist2, scratch);
    }
  });
}

}  // namespace

void knn_exact(const MatrixF& x, int k, std::vector<int>& neighbours, std::vector<float>& dist2,
               const std::atomic<bool>* cancel) {
  const int n = static_cast<int>(x.rows());
  if (k < 1 || k > n - 1)
    throw InputError("nearest neighbours: k must be in [1, " + std::to_string(n - 1) + "], got " +
                     std::to_string(k));
  // A NaN distance fails every compare and breaks the ordering the ranking relies on.
  if (!x.rowwise().squaredNorm().allFinite())
    throw InputError(
        "nearest neighbours: the points hold NaN or Inf, or values too large for float distances");
  neighbours.assign(static_cast<size_t>(n) * k, 0);
  dist2.assign(static_cast<size_t>(n) * k, 0.f);
  if (x.cols() <= 32) {
    knn_kdtree(x, k, neighbours, dist2, cancel);
  } else {
    knn_brute_force(x, k, neighbours, dist2, cancel);
  }
  if (is_set(cancel)) throw Cancelled();
}

}  // namespace kvscope
