// Practical BalanceKV (docs/balancekv.md, "balancekv"): the self-balancing walk over blocks of
// keys and values, exact halving, weights across rounds, the top-up for ratios that are not
// powers of two, the needle variant's protected keys, and walk traces. The walk itself goes
// through Backend::walk_blocks; its CPU reference cpu_walk_blocks (engine/ops/walk_blocks.h) is
// engine/ops/walk_blocks_cpu.cpp; the parameters are engine/methods/balancekv/balance_params.cpp,
// the halving rules engine/methods/balancekv/balance_halving.cpp. See docs/balancekv.md for the
// exact rules.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/attention/walk_trace.h"
#include "engine/core/tensor.h"
#include "engine/methods/method.h"
#include "engine/ops/walk_blocks.h"

namespace kvscope {

class Backend;
struct EvalWindow;
struct LayerData;

// Parameters of the practical walk. The defaults are the authors' public `balanced_walk`
// (gamma 4, temp 1, beta 0, block 128, value term +0.025); the four switches below select
// KVScope's earlier variant one detail at a time (preset kvscope-v1 selects all four).
enum class HalvingRule {
  Authors,   // c = max(first index where #-1 reaches n//2, same for +1); keep 2*sign up to c
             // (flipped when sigma_c = +1) and 1 after c, first `keep` by stable descending weight
  Balanced,  // the first sign to be drawn n - keep times is the majority (exact_halving)
};
enum class Centring {
  PaddedBlock,  // zero-pad to a multiple of B, block mean over all B rows (padding included)
  RealRows,     // last block shorter, mean over its real rows
};
enum class KeptCount {
  FloorHalving,  // floor(n/2) per round, log2(1/ratio) rounds: at most the budget
  Budget,        // round(n0/2^r) per round, ending at round(ratio * n_mid)
};
struct BalanceParams {
  double gamma = 4;  // p_i = 1/2 - gamma * sum_{j<i} K_ij sigma_j; 0: fair coins, same halving
  double temp = 1;   // K_ij = exp(temp <k_i,k_j>/sqrt d - beta) * (<v_i,v_j> + value_bias)
  double beta = 0;
  double value_bias = 0.025;
  int block = 128;                      // B: walk block length
  bool protect_anticorrelated = false;  // the needle variant
  HalvingRule halving = HalvingRule::Authors;
  Centring centring = Centring::PaddedBlock;
  bool float32 = true;  // the authors' float32 kernel with IEEE overflow; false: double, clipped
  KeptCount kept = KeptCount::FloorHalving;
};
// The authors' +1e-8 in the value term (float32 only; the double variant never had it).
constexpr double kAuthorsValueEps = 1e-8;

// The walk op's parameters for one round of BalanceKV's walk (engine/ops/walk_blocks.h): seed,
// layer, round and the walk's gamma, temp, beta, value bias and precision; the rows and blocks
// are the caller's.
WalkBatch walk_batch_of(const BalanceParams& prm, uint64_t seed, int layer, int round);

// The ParamSpecs of the `balancekv` method, and the parsed, validated values (InputError names
// the parameter and the allowed range).
std::vector<ParamSpec> balancekv_param_specs();
BalanceParams balance_params_from(const ParamValues& values);
// `p` with the four switches set to KVScope's earlier variant (preset kvscope-v1).
BalanceParams kvscope_v1_params(BalanceParams p);

// ---- Halving of one round (docs/balancekv.md). Given the round's signs in walk order and how many
// elements to keep, returns the survivors (positions in walk order, ascending) and their weight
// factors. Both rules keep `keep` elements.
struct Halving {
  std::vector<int> kept;       // positions (walk order) that survive, ascending
  std::vector<double> factor;  // weight factor of each kept position (2 or 1)
  int cut = -1;                // the cut c: factor 2 up to it, 1 after it
  int majority_sign = +1;      // the sign dropped up to the cut
};
// KVScope's earlier rule (halving = balanced): keep = floor(n/2) or ceil(n/2), n >= 2; `cut` is
// the first position where one sign (the "majority") has been drawn n - keep times. Up to and
// including `cut` the minority sign is kept with factor 2; every element after `cut` with factor 1.
Halving exact_halving(const std::vector<int8_t>& sigma, int keep);
// The authors' rule (halving = authors), as their balanced_walk computes it: c_neg / c_pos = the
// first index where the running count of -1 / +1 reaches n//2 (0 when it never does), c =
// max(c_neg, c_pos); weight 2*sigma_i for i <= c (negated when sigma_c = +1), 1 for i > c; the
// first `keep` positions by stable descending weight survive (0 <= keep <= ceil(n/2)). For odd n
// and keep = n//2 the last position is dropped unless every position after c is needed.
Halving authors_halving(const std::vector<int8_t>& sigma, int keep);

// How many elements survive each round when walking n0 elements down to `target` (0 < target <
// n0): s_r = round(n0 / 2^r), for rounds r = 1..R where R is the first round with s_r <= target.
// Each s_r is floor or ceil of s_{r-1}/2, so every round is a halving. The last entry may be
// below `target`; the remainder is topped up from that round's dropped elements.
std::vector<int> halving_schedule(int n0, int target);
// The authors' schedule: s_r = floor(s_{r-1} / 2) until s_r <= target (kept = floor-halving).
std::vector<int> floor_halving_schedule(int n0, int target);

// Protected keys of the needle variant for the middle [mid_begin, mid_end): a key is flagged when
// its mean raw inner product with its block of B consecutive middle keys is <= 0, and every key
// within +-25 positions of a flagged key is protected. At most `cap` keys are protected: flagged
// keys are taken most anti-correlated first, each with its +-25 neighbourhood nearest first.
// Returns sorted absolute token indices.
std::vector<int> protected_anticorrelated(const MatrixF& keys, int mid_begin, int mid_end,
                                          int block, int cap);
constexpr int kProtectDilation = 25;

// One head's walk: walk `tokens` (absolute indices, ascending) down to `target` kept tokens.
struct WalkJob {
  const MatrixF* keys = nullptr;    // n x d, the whole head
  const MatrixF* values = nullptr;  // n x dv
  int kv_head = 0;
  std::vector<int> tokens;
  int target = 0;
  // Whether the last round tops up to `target` from its dropped tokens (ratios that are not powers
  // of two, or kept = budget); otherwise the walk keeps what the schedule leaves.
  bool top_up = true;
  // Traces: when `trace_query` is non-empty (length d), every block of every round is recorded
  // with the discrepancy measured along this query vector.
  std::vector<float> trace_query;
};

struct WalkOutcome {
  std::vector<int> indices;     // kept absolute token indices, ascending
  std::vector<double> weights;  // accumulated weights
  int rounds = 0;
  int topped_up = 0;  // how many tokens the top-up added after the last round
  // Steps (rows 1.. of each real block, every round) whose p fell outside (0, 1) or was NaN, so
  // the sign was forced: saturated_steps / walked_steps is WalkTrace::saturation.
  long saturated_steps = 0, walked_steps = 0;
  std::vector<WalkBlockTrace> trace_blocks;
};

// Runs every job round by round; each round walks all blocks of all jobs still halving in ONE
// Backend::walk_blocks call (backend nullptr: the CPU reference). Results do not depend on which
// jobs share a call: the walk's random numbers are keyed by (seed, layer, head, round, block, i).
std::vector<WalkOutcome> run_balance_walks(const std::vector<WalkJob>& jobs, int layer,
                                           uint64_t seed, const BalanceParams& params,
                                           Backend* backend);

// The `balancekv` method's selection for one kv head (validates `in`, throws InputError).
Selection balancekv_select(const MethodInput& in);

// The whole layer at once for live GPU use: every kv head of `layer` with the window `w` and
// `seed`. On a GPU backend all heads' blocks of a round go to it in one walk_blocks call; on the
// CPU the heads are spread over the cores (one call per thread and round). Entry h equals
// balancekv_select for kv head h with the same inputs. Refused heads get an empty selection whose
// note says why.
std::vector<Selection> balancekv_layer(const LayerData& layer, int num_layers, const EvalWindow& w,
                                       uint64_t seed, const ParamValues& params, Backend& backend,
                                       bool want_trace = false, int trace_query = -1);

// ---- Traces. Fills the derived series of a block trace from the block's full symmetric kernel
// matrix K (L x L, the walk's kernel), its signs, and the per-element query terms
// z_j = exp(<k_j,q>/sqrt d) v_j (L x dv): discrepancy along q, kernel-space norm
// sqrt(sigma^T K sigma), the same two for random signs drawn from
// counter_uniform(seed, kRandRandomSigns, layer, head, round, block, i), and the 2-D kernel-PCA
// path of the prefix signed sums (docs/balancekv.md derives the projection). `t.sigma` must be
// set; p/partial are left as they are.
void fill_block_trace(WalkBlockTrace& t, const MatrixD& kernel, const MatrixD& query_terms,
                      uint64_t seed, uint32_t layer, uint32_t head, uint32_t round, uint32_t block);

// The query vector a trace measures discrepancy along: row `position` (-1: n-1) of the group's
// first query head, or of the keys when there are no queries. Throws InputError when out of range.
std::vector<float> trace_query_vector(const MethodInput& in, int* position_out);

}  // namespace kvscope
