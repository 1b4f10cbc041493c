// What the kvpress wrappers (adakv.cpp, chunkkv.cpp, criticalkv.cpp) share: their parameter
// lists (their own, then the inner method's), the split of MethodInput::params between the two,
// and the inner method's scores of every kv head of the layer.
#pragma once

#include <string>
#include <vector>

#include "engine/methods/method.h"

namespace kvscope {

class WrapperBase : public Method {
 public:
  // `own` are the wrapper's parameters (kvpress's names); an own name that the inner method also
  // has is renamed "<wrapper>_<name>" so both stay settable.
  WrapperBase(std::string wrapper, const Method& inner, std::vector<ParamSpec> own);
  std::string name() const override { return wrapper_ + "(" + inner_.name() + ")"; }
  std::vector<ParamSpec> params() const override;
  bool needs_queries() const override { return inner_.needs_queries(); }
  bool needs_rope() const override { return inner_.needs_rope(); }
  bool depends_on_seed() const override { return inner_.depends_on_seed(); }

 protected:
  // The value of own parameter `name` (kvpress's name) in `in`.
  double own_param(const MethodInput& in, const std::string& name) const;
  // `in` with only the inner method's parameters.
  MethodInput inner_input(const MethodInput& in) const;
  // Checks in's parameters, and that the inner ranking carries scores.
  void check(const MethodInput& in) const;
  // The inner method's ranking of kv head `kv` of in's layer (in.layer_data required).
  Ranking inner_rank_of_head(const MethodInput& in, int kv) const;
  // The inner ranking's scores of every kv head of the layer, [kv head][middle position]; empty
  // for a head the capture refuses (NaN/Inf). Refuses without MethodInput::layer_data.
  // `own`, when given, is the inner ranking of in.kv_head already made (not made again).
  std::vector<std::vector<double>> layer_scores(const MethodInput& in,
                                                const Ranking* own = nullptr) const;
  // Its scores, refusing a ranking without them.
  const std::vector<double>& scores_of(const Ranking& r) const;

  std::string wrapper_;
  const Method& inner_;
  std::vector<ParamSpec> own_;  // renamed where they clash
  std::vector<std::string> own_kvpress_names_;
};

}  // namespace kvscope
