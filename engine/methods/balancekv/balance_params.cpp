// Parameters of the practical BalanceKV walk (engine/methods/balancekv/balance_walk.h): the
// ParamSpecs the method registry, the CLI and the app show, and their translation into
// BalanceParams.
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/methods/balancekv/balance_walk.h"

namespace kvscope {

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
  validate_params(specs, values, "balancekv");
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

}  // namespace kvscope
