#include "engine/knn.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nanoflann.hpp>
#include <string>
#include <utility>

#include "engine/error.h"
#include "engine/tsne_util.h"

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

// For every point, the k best candidates offered so far: a max-heap on (distance, index), so the
// worst kept one is on top and a new one is compared with it alone. `worst` mirrors the top's
// distance (+inf until k are kept) so most offers are rejected by one load and one compare.
class NearestSets {
 public:
  NearestSets(int n, int k)
      : k_(k),
        heap_(static_cast<size_t>(n) * k),
        size_(n, 0),
        worst_(n, std::numeric_limits<float>::infinity()) {}

  void offer(int i, float d, int j) {
    if (d > worst_[i]) return;
    Candidate* h = &heap_[static_cast<size_t>(i) * k_];
    int& s = size_[i];
    const Candidate c{d, j};
    if (s < k_) {
      h[s++] = c;
      std::push_heap(h, h + s, before);
      if (s == k_) worst_[i] = h[0].d;
      return;
    }
    if (!before(c, h[0])) return;
    // Replace the top and sift it down.
    int at = 0;
    for (;;) {
      int child = 2 * at + 1;
      if (child >= k_) break;
      if (child + 1 < k_ && before(h[child], h[child + 1])) ++child;
      if (!before(c, h[child])) break;
      h[at] = h[child];
      at = child;
    }
    h[at] = c;
    worst_[i] = h[0].d;
  }
  // The kept candidates of point i (unordered).
  const float* worst() const { return worst_.data(); }
  const Candidate* begin(int i) const { return &heap_[static_cast<size_t>(i) * k_]; }
  int size(int i) const { return size_[i]; }

 private:
  int k_;
  std::vector<Candidate> heap_;
  std::vector<int> size_;
  std::vector<float> worst_;
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

void write_row(int i, int k, std::vector<Candidate>& cand, std::vector<int>& neighbours,
               std::vector<float>& dist2) {
  std::sort(cand.begin(), cand.end(), before);
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
  tsne_parallel_for(n, 256, [&](int b, int e) {
    std::vector<uint32_t> idx(k + 1);
    std::vector<float> dd(k + 1);
    std::vector<Candidate> cand;
    for (int i = b; i < e; ++i) {
      if ((i & 255) == 0 && is_set(cancel)) return;
      const size_t found = tree.knnSearch(x.row(i).data(), k + 1, idx.data(), dd.data());
      cand.clear();
      // The point itself is dropped (found among the k + 1 unless k + 1 duplicates tie with it).
      for (size_t r = 0; r < found; ++r)
        if (static_cast<int>(idx[r]) != i) cand.push_back({dd[r], static_cast<int>(idx[r])});
      std::sort(cand.begin(), cand.end(), before);
      cand.resize(std::min<size_t>(cand.size(), k));
      write_row(i, k, cand, neighbours, dist2);
    }
  });
}

void knn_brute_force(const MatrixF& x, int k, std::vector<int>& neighbours,
                     std::vector<float>& dist2, const std::atomic<bool>* cancel) {
  const int n = static_cast<int>(x.rows());
  const VectorF norms = x.rowwise().squaredNorm();
  constexpr int kBlock = 512;
  constexpr int kChunk = 16;
  const int blocks = (n + kBlock - 1) / kBlock;
  // Tiles (I, J), J >= I, diagonal first, then by distance from it: neighbouring tokens of a
  // capture tend to be near in key space too, so the heaps fill with close candidates early and
  // later offers are mostly rejected by the first compare (in index order, candidates that keep
  // getting closer made the heaps take several times more updates).
  std::vector<std::pair<int, int>> tiles;
  for (int gap = 0; gap < blocks; ++gap)
    for (int bi = 0; bi + gap < blocks; ++bi) tiles.emplace_back(bi, bi + gap);
  const int threads = tsne_threads(static_cast<int>(tiles.size()), 8);
  std::vector<NearestSets> sets;
  sets.reserve(threads);
  for (int t = 0; t < threads; ++t) sets.emplace_back(n, k);
  // Thread t takes tiles t, t + threads, ...: balanced, and which thread saw a pair does not
  // change the merged result.
  tsne_parallel_for(threads, 1, [&](int tb, int te) {
    MatrixF dots(kBlock, kBlock);
    for (int t = tb; t < te; ++t) {
      NearestSets& mine = sets[t];
      for (size_t at = t; at < tiles.size(); at += threads) {
        if (is_set(cancel)) return;
        const int i0 = tiles[at].first * kBlock, i1 = std::min(n, i0 + kBlock);
        const int j0 = tiles[at].second * kBlock, j1 = std::min(n, j0 + kBlock);
        const bool diagonal = i0 == j0;
        auto tile = dots.topLeftCorner(i1 - i0, j1 - j0);
        tile.noalias() = x.middleRows(i0, i1 - i0) * x.middleRows(j0, j1 - j0).transpose();
        const float* nj = norms.data() + j0;
        const float* wj = mine.worst() + j0;
        for (int i = i0; i < i1; ++i) {
          const float* row = &dots(i - i0, 0);
          // Chunks of kChunk distances: one vectorised pass says whether any of them beats
          // point i's or its partner's current k-th distance (rare once the heaps are full);
          // only then are they offered one by one (offer() checks again, exactly).
          for (int b = diagonal ? i + 1 - j0 : 0; b < j1 - j0; b += kChunk) {
            const int len = std::min(kChunk, j1 - j0 - b);
            float dd[kChunk];
            const float ni = norms(i), wi = mine.worst()[i];
            int any = 0;
            if (len == kChunk) {
              for (int c = 0; c < kChunk; ++c) {
                dd[c] = ni + nj[b + c] - 2.f * row[b + c];
                any |= (dd[c] <= wi) | (dd[c] <= wj[b + c]);
              }
            } else {
              for (int c = 0; c < len; ++c) {
                dd[c] = ni + nj[b + c] - 2.f * row[b + c];
                any |= (dd[c] <= wi) | (dd[c] <= wj[b + c]);
              }
            }
            if (!any) continue;
            for (int c = 0; c < len; ++c) {
              const int j = j0 + b + c;
              mine.offer(i, dd[c], j);
              mine.offer(j, dd[c], i);
            }
          }
        }
      }
    }
  });
  if (is_set(cancel)) return;
  tsne_parallel_for(n, 1024, [&](int b, int e) {
    std::vector<Candidate> cand;
    for (int i = b; i < e; ++i) {
      cand.clear();
      for (const NearestSets& s : sets) cand.insert(cand.end(), s.begin(i), s.begin(i) + s.size(i));
      write_row(i, k, cand, neighbours, dist2);
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
