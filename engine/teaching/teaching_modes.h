// The second half of the talk (balancekv-talk.md) for the Teaching view: the exp-kernel embedding
// with the numerator and denominator walks, the random-signs race as n grows, and
// merge-and-reduce filling level by level (docs/balancekv.md, "Teaching walk"). Everything is
// computed here in double precision (the merge-and-reduce tree runs the engine's own
// SoftmaxBalance and MergeAndReduce); the view only draws.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace kvscope {

class MergeAndReduce;

using TeachVec2 = std::array<double, 2>;

// ---- The exp kernel's features in 2-D: the truncated Taylor map.
// exp(<k,q>/sqrt d) = sum_j (<k,q>/sqrt d)^j / j!, and (<k,q>)^j = sum_a C(j,a) (k1 q1)^a
// (k2 q2)^(j-a), so phi(x) has one entry per monomial x1^a x2^(j-a), j = 0..p, a = 0..j, with
// coefficient sqrt(C(j,a) / (j! d^(j/2))); <phi(k), phi(q)> is the Taylor series of the kernel
// cut after degree p, with dimension (p+1)(p+2)/2. Not exact: the error is the series' tail,
// at most truncation_bound(|k||q|/sqrt d, p).
class ExpFeatures2D {
 public:
  static constexpr int kDim = 2;            // d of the kernel: exp(<k,q>/sqrt 2)
  explicit ExpFeatures2D(int degree = 14);  // InputError unless 0 <= degree <= 40
  int degree() const { return degree_; }
  int dim() const { return (degree_ + 1) * (degree_ + 2) / 2; }
  std::vector<double> phi(TeachVec2 x) const;
  static double kernel(TeachVec2 k, TeachVec2 q);  // exp(<k,q>/sqrt 2)
  // sum_{j > p} t^j / j! (the tail of the series at t = |<k,q>|/sqrt d or any bound on it).
  static double truncation_bound(double t, int degree);

 private:
  int degree_;
  std::vector<double> coef_;  // per entry, in phi's order
  std::vector<int> power1_;   // exponent of x1 per entry (x2's is j - a)
  std::vector<int> total_;    // j per entry
};

// ---- The exp kernel's two walks (the talk: "applied to denominator" and "applied to
// numerator"): n 2-D keys k_i and values v_i, a query q. The denominator walk is the
// self-balancing walk on u_i = phi(k_i), the numerator walk on psi_i = phi(k_i) (x) v_i, both with
// p_j = 1/2 - <w_j, u_j> / (2c) computed from the explicit features (the talk's kernel form
// sum_{i<j} sigma_i exp(<k_i,k_j>/sqrt d) (<v_i,v_j>) is recorded beside it). Both walks and the
// random-signs reference use the same uniform at each step (sigma = + when uniform < p, random:
// when uniform < 1/2), counter_uniform(seed, kRandMisc, 0, 0, 0, 0xE4, j).
class ExpKernelWalk {
 public:
  struct Step {
    int index = 0;
    double uniform = 0;
    // Denominator walk.
    double den_inner = 0;         // <w_j, phi(k_j)> from the features
    double den_inner_kernel = 0;  // sum_{i<j} sigma_i exp(<k_i,k_j>/sqrt 2)
    double p_den = 0.5;
    int sigma_den = +1;
    // Numerator walk.
    double num_inner = 0;         // <w_j, phi(k_j) (x) v_j> from the features
    double num_inner_kernel = 0;  // sum_{i<j} sigma_i exp(<k_i,k_j>/sqrt 2) <v_i, v_j>
    double p_num = 0.5;
    int sigma_num = +1;
    int sigma_random = +1;
    double e = 0;  // exp(<k_j, q>/sqrt 2)
    // Signed sums along q after this step: sum_{i<=j} sigma_i e_i (denominator) and
    // sum_{i<=j} sigma_i e_i v_i (numerator), for each walk and for random signs.
    double den_walk = 0, den_random = 0;
    TeachVec2 num_walk{0, 0}, num_random{0, 0};
  };

  // n keys with coordinates N(0, key_scale^2), values N(0, 1), from the seed; q = (0.9, 0.45).
  // c = c_factor * max_i |u_i|^2 per walk (the largest squared feature norm: then
  // |<w_j,u_j>| <= c keeps p in [0, 1] while |w_j| <= max |u_i|). InputError for n outside
  // [1, 256], c_factor <= 0 or a bad degree.
  ExpKernelWalk(int n, uint64_t seed, double c_factor = 0.25, double key_scale = 0.6,
                int degree = 14);

  bool step();  // signs the next token (both walks); false when done
  void run();
  void reset();
  bool done() const { return steps_.size() == keys_.size(); }
  int n() const { return static_cast<int>(keys_.size()); }

  const std::vector<TeachVec2>& keys() const { return keys_; }
  const std::vector<TeachVec2>& values() const { return values_; }
  TeachVec2 query() const { return q_; }
  const std::vector<Step>& steps() const { return steps_; }
  const ExpFeatures2D& features() const { return features_; }
  double c_den() const { return c_den_; }
  double c_num() const { return c_num_; }
  // The true sums over all n tokens: sum e_i and sum e_i v_i.
  double exact_den() const;
  TeachVec2 exact_num() const;
  // Largest |<phi(k_i),phi(q)> - exp(<k_i,q>/sqrt 2)| over the keys (the truncation's effect).
  double feature_error() const;

 private:
  ExpFeatures2D features_;
  std::vector<TeachVec2> keys_, values_;
  TeachVec2 q_{0.9, 0.45};
  std::vector<std::vector<double>> phi_;  // phi(k_i)
  std::vector<double> e_;                 // exp(<k_i,q>/sqrt 2)
  double c_den_ = 1, c_num_ = 1;
  uint64_t seed_;
  std::vector<double> w_den_, w_num_;  // the walks' prefix sums in feature space
  std::vector<Step> steps_;
};

// ---- The random-signs race: n_max unit vectors in R^dim (Gaussian directions from the seed),
// signed by the self-balancing walk (p_j = 1/2 - <w_j,u_j>/(2c), clipped) and by fair coins on
// the same vectors. disc(n) = |sum_{i<=n} sigma_i u_i| (Euclidean; it bounds the signed sum
// along every unit z). Fair coins grow like sqrt(n) (E|.|^2 = n exactly); the walk stays
// O(sqrt(dim) log n)-ish. Walk uniforms: counter_uniform(seed, kRandMisc, 0, 0, 1, 0xACE, i);
// coins: the same with round 2.
struct DiscrepancyRace {
  int dim = 2;
  double c = 1;
  std::vector<double> walk, random;  // disc(n) at n = 1..n_max (index n-1)
  std::vector<int> clipped;          // per step: 1 when the walk's p fell outside [0, 1]
  // The largest disc over n' <= n: what the walk keeps small at every prefix.
  static double max_upto(const std::vector<double>& disc, int n);
};
// InputError for n_max outside [1, 1 << 16], dim outside [1, 64] or c <= 0.
DiscrepancyRace run_discrepancy_race(int n_max, int dim, double c, uint64_t seed);

// ---- Merge-and-reduce as balancekv-stream runs its denominator instance (Algorithm 3 with
// SoftmaxBalance, engine/methods/balancekv/softmax_balance.h), on n 2-D keys N(0, key_scale^2) from
// the seed: the same batch t and levels T its budget search picks for n middle tokens at budget m,
// the same c = c_scale * 30 log(n / delta), R = exp(r_key^2 / (2 sqrt 2)), layer 0, head 0,
// instance 0 -- so the kept set and weights 2^l equal balancekv-stream's denominator set on these
// keys. Tokens arrive one per step(); every merge (reduction of a level) is recorded.
class MergeReduceTeaching {
 public:
  struct Merge {
    int after_token = 0;     // the merge ran when this token (0-based) arrived
    int level = 0;           // C^level was reduced into C^(level+1)
    int call = 0;            // reductions of this level so far
    std::vector<int> input;  // the tokens of C^level, in walk order
    std::vector<int> sigma;  // SoftmaxBalance's signs, per input
    std::vector<double> p;   // its probabilities (before clipping)
    std::vector<int> kept;   // the smaller sign class (ties: +), ascending
    int fail_steps = 0;
  };

  // InputError for n outside [2, 4096], budget outside [1, n - 1], c_scale outside (0, 1],
  // delta outside (0, 0.5].
  MergeReduceTeaching(int n, int budget, uint64_t seed, double c_scale = 1.0, double delta = 0.01,
                      double key_scale = 0.6);
  ~MergeReduceTeaching();
  MergeReduceTeaching(const MergeReduceTeaching&) = delete;  // the reduction refers to this
  MergeReduceTeaching& operator=(const MergeReduceTeaching&) = delete;

  bool step();  // the next token arrives (and any merges it triggers run); false when done
  void run();
  void reset();
  bool done() const { return pushed_ == n_; }
  int pushed() const { return pushed_; }
  int n() const { return n_; }
  int budget() const { return budget_; }
  int batch() const { return batch_; }
  int levels() const { return levels_; }
  double c() const { return c_; }
  double radius() const { return radius_; }
  const MatrixF& keys() const { return keys_; }
  // C^0 .. C^T now (C^l weighted 2^l).
  const std::vector<std::vector<int>>& level_sets() const;
  const std::vector<Merge>& merges() const { return merges_; }  // in order
  // Merges that the last step() ran (indices into merges()).
  int last_step_first_merge() const { return last_first_; }
  // (token, weight 2^l) of every token in the levels, sorted by token.
  std::vector<std::pair<int, double>> kept_with_weights() const;
  long long size_bound() const;  // merge_and_reduce_bound(n, t, T)

 private:
  int n_, budget_;
  uint64_t seed_;
  int batch_ = 2, levels_ = 0;
  double c_ = 1, radius_ = 1;
  MatrixF keys_;
  int pushed_ = 0, last_first_ = 0;
  double c_scale_, delta_;
  std::unique_ptr<MergeAndReduce> mr_;  // engine/methods/balancekv/softmax_balance.h
  std::vector<Merge> merges_;
};

}  // namespace kvscope
