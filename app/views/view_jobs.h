// Pieces the views' own job inputs share (JobPlan::derive, app/app_state.h; docs/design.md,
// "Keys and results"): a method run's settings as plain values, and the handles a view's job
// reads through (the capture by its id, the focused layer by its index, the backend by its name).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/app_state.h"
#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"

namespace kvscope::app {

// One method's settings as a job reads them (MethodSettings by value: the method by its name,
// the window's overrides as passed to the engine).
struct MethodRunInput {
  std::string method;
  ParamValues params;
  double keep_ratio = 0;
  int sink = -1, eval = -1;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MethodRunInput, method, params, keep_ratio, sink, eval)

inline MethodRunInput method_run_input(const std::string& name, const MethodSettings& ms) {
  return {name, ms.params, ms.keep_ratio, ms.sink, ms.eval};
}

// The MethodSettings of `in` (estimator as given); throws InputError for an unknown method.
inline MethodSettings method_settings_of(const MethodRunInput& in,
                                         Estimator estimator = Estimator::Weighted) {
  MethodSettings ms;
  ms.method = find_method(in.method);
  if (!ms.method) throw InputError("unknown method '" + in.method + "'");
  ms.keep_ratio = in.keep_ratio;
  ms.params = in.params;
  ms.sink = in.sink;
  ms.eval = in.eval;
  ms.estimator = estimator;
  return ms;
}

// A job's handles.
struct CaptureRef {
  std::shared_ptr<CaptureFile> capture;  // the input's capture id
  Backend* backend = nullptr;            // the input's backend name (null: not read)
};
struct LayerRef {
  std::shared_ptr<const LayerData> layer;  // the input's (capture, layer)
  Backend* backend = nullptr;              // the input's backend name (null: not read)
};
struct NoHandles {};

}  // namespace kvscope::app
