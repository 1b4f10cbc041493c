#include "engine/methods/wrapper_util.h"

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {

WrapperBase::WrapperBase(std::string wrapper, const Method& inner, std::vector<ParamSpec> own)
    : wrapper_(std::move(wrapper)), inner_(inner), own_(std::move(own)) {
  const std::vector<ParamSpec> theirs = inner_.params();
  for (ParamSpec& p : own_) {
    own_kvpress_names_.push_back(p.name);
    for (const ParamSpec& q : theirs)
      if (q.name == p.name) p.name = wrapper_ + "_" + p.name;
  }
}

std::vector<ParamSpec> WrapperBase::params() const {
  std::vector<ParamSpec> all = own_;
  for (const ParamSpec& p : inner_.params()) all.push_back(p);
  return all;
}

double WrapperBase::own_param(const MethodInput& in, const std::string& name) const {
  for (size_t i = 0; i < own_.size(); ++i)
    if (own_kvpress_names_[i] == name) return param_value(own_, in.params, own_[i].name);
  throw std::logic_error(name + " is no parameter of " + wrapper_);
}

MethodInput WrapperBase::inner_input(const MethodInput& in) const {
  MethodInput out = in;
  for (const ParamSpec& p : own_) out.params.erase(p.name);
  return out;
}

void WrapperBase::check(const MethodInput& in) const {
  validate_params(params(), in.params, name());
}

const std::vector<double>& WrapperBase::scores_of(const Ranking& r) const {
  if (r.scores.size() != r.order.size())
    throw InputError(name() + ": " + inner_.name() + " gives no scores to compare");
  return r.scores;
}

Ranking WrapperBase::inner_rank_of_head(const MethodInput& in, int kv) const {
  if (kv == in.kv_head) return inner_.rank(inner_input(in));
  EvalWindow w;
  w.n = in.n;
  w.sink = in.sink;
  w.eval = in.eval;
  w.mid_begin = in.mid_begin;
  w.mid_end = in.mid_end;
  w.n_mid = in.mid_end - in.mid_begin;
  w.budget = in.budget;
  w.keep_ratio = in.keep_ratio;
  MethodInput other =
      make_method_input(*in.layer_data, in.num_layers, kv, w, inner_input(in).params, in.seed);
  other.cancel = in.cancel;
  other.backend = in.backend;
  return inner_.rank(other);
}

std::vector<std::vector<double>> WrapperBase::layer_scores(const MethodInput& in,
                                                           const Ranking* own) const {
  if (!in.layer_data)
    throw InputError(name() +
                     ": needs every kv head of the layer at once, and this caller gives "
                     "one head only");
  const int heads = static_cast<int>(in.layer_data->keys.size());
  std::vector<std::vector<double>> out(heads);
  for (int kv = 0; kv < heads; ++kv) {
    if (in.cancel && in.cancel->load()) throw Cancelled();
    // A refused head (NaN/Inf in the capture) takes no part: it stays empty.
    if (kv < static_cast<int>(in.layer_data->refused.size()) &&
        !in.layer_data->refused[kv].empty() && kv != in.kv_head)
      continue;
    out[kv] = own && kv == in.kv_head ? scores_of(*own) : scores_of(inner_rank_of_head(in, kv));
  }
  return out;
}

}  // namespace kvscope
