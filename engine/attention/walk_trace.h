// What a self-balancing walk did, block by block and round by round (docs/balancekv.md, last
// paragraph). Recorded by balancekv / balancekv-stream when MethodInput::want_trace is set.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace kvscope {

struct WalkBlockTrace {
  int round = 0;                // 0-based halving round
  int block = 0;                // block index within the round
  std::vector<int> tokens;      // absolute token index of each walked element, in walk order
  std::vector<double> p;        // p_i before clipping
  std::vector<int> sigma;       // +1 / -1
  std::vector<double> partial;  // sum_{j<i} K_ij sigma_j
  // Discrepancy of the prefix along the trace query q: sum_{j<=i} sigma_j exp(<k_j,q>/sqrt d) v_j
  // (its norm), and the kernel-space norm sqrt(sigma^T K sigma) of the prefix.
  std::vector<double> disc_query;
  std::vector<double> disc_kernel;
  // The same two for random +-1 signs on the same block.
  std::vector<double> random_disc_query;
  std::vector<double> random_disc_kernel;
  // Prefix signed sum projected on the block's top two kernel-PCA directions.
  std::vector<std::array<double, 2>> path;
  std::vector<std::array<double, 2>> random_path;
  std::vector<int> kept;  // 1 where the token survived this round's halving (2: added back
                          // by the top-up of a non-power-of-two ratio), 0 dropped
  int halving_cut = -1;   // the index c where the majority sign reached n/2
  // Where this block sits in its round's whole walk order (the halving runs over the whole
  // round): halving_cut above is the round's cut when it falls inside this block, else -1;
  // round_cut is the round's cut as a position in the round's walk order.
  int block_start = 0;
  int round_cut = -1;
  // Fraction of this block's steps 1.. with p outside (0, 1) (or NaN). The block's zero-padding
  // rows (centring = padded-block) are walked but not recorded here.
  double saturation = 0;
};

struct WalkTrace {
  int rounds = 0;
  // Fraction of all walk steps (every round and block, real rows, steps after the first) whose p
  // was clipped to 0 or 1 (p <= 0, p >= 1, or NaN from float32 overflow): the sign was forced,
  // not drawn. Near 1 the walk is deterministic; lower `temp` to make it random again.
  double saturation = 0;
  long saturated_steps = 0, walked_steps = 0;
  int kept = 0, budget = 0;  // tokens the walk kept vs the protocol's budget m
  int trace_query = -1;      // absolute position of the query used for disc_query
  std::vector<WalkBlockTrace> blocks;
  std::string note;
};

}  // namespace kvscope
