// The evaluation window (engine/attention/eval_window.h, docs/evaluation.md).
#include "engine/attention/eval_window.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/printable.h"

namespace kvscope {

EvalWindow EvalWindow::make(int n, double keep_ratio, int sink_override, int eval_override) {
  if (!(keep_ratio > 0 && keep_ratio <= 1))
    throw SettingError("keep ratio", "--ratios",
                       "keep ratio " + fmt_double(keep_ratio) + " is not in (0, 1]");
  if (n <= 0) throw InputError("capture has no tokens to evaluate");
  EvalWindow w;
  w.n = n;
  w.keep_ratio = keep_ratio;
  w.sink_overridden = sink_override >= 0;
  w.eval_overridden = eval_override >= 0;
  w.sink = w.sink_overridden ? sink_override : std::min(256, n / 32);
  w.eval = w.eval_overridden ? eval_override : std::min(256, n / 8);
  if (w.eval < 1)
    throw SettingError("evaluation queries (E)", "--eval",
                       w.eval_overridden
                           ? std::string("needs at least 1 evaluation query")
                           : "the capture has only " + std::to_string(n) +
                                 " tokens: E = floor(n/8) = 0 evaluation queries (set E)");
  if (w.sink + w.eval > n)
    throw SettingError("sinks (s) and evaluation queries (E)", "--sink/--eval",
                       "s + E = " + std::to_string(w.sink) + " + " + std::to_string(w.eval) +
                           " exceeds the capture's " + std::to_string(n) + " tokens");
  w.mid_begin = w.sink;
  w.mid_end = n - w.eval;
  w.n_mid = w.mid_end - w.mid_begin;
  w.budget = static_cast<int>(std::llround(keep_ratio * w.n_mid));
  return w;
}

EvalWindow::Fitted EvalWindow::fit(int n, double keep_ratio, int sink_request, int eval_request) {
  Fitted out;
  std::vector<std::string> notes;
  if (!(keep_ratio > 0 && keep_ratio <= 1)) {
    notes.push_back("keep ratio " + fmt_double(keep_ratio) + " is not in (0, 1]; using 0.5");
    keep_ratio = 0.5;
  }
  n = std::max(n, 1);
  const int default_eval = std::max(1, std::min(256, n / 8));
  int eval = eval_request >= 0 ? eval_request : default_eval;
  if (eval < 1 || eval > n) {
    const int fitted = std::clamp(eval, 1, n);
    notes.push_back(
        (eval_request >= 0 ? "eval " + std::to_string(eval_request) : "E = floor(n/8) = 0") +
        " does not fit a " + std::to_string(n) + "-token capture: E = " + std::to_string(fitted));
    eval = fitted;
  } else if (eval_request < 0 && n / 8 < 1) {
    notes.push_back("a " + std::to_string(n) +
                    "-token capture is too short for E = floor(n/8): E = 1");
  }
  const int default_sink = std::min(256, n / 32);
  int sink = sink_request >= 0 ? sink_request : default_sink;
  if (sink > n - eval) {
    notes.push_back((sink_request >= 0 ? "sink " + std::to_string(sink_request)
                                       : "s = " + std::to_string(sink)) +
                    " does not fit a " + std::to_string(n) + "-token capture with E = " +
                    std::to_string(eval) + ": s = " + std::to_string(n - eval));
    sink = n - eval;
  }
  out.window.n = n;
  out.window.keep_ratio = keep_ratio;
  out.window.sink_overridden = sink_request >= 0;
  out.window.eval_overridden = eval_request >= 0;
  out.window.sink = sink;
  out.window.eval = eval;
  out.window.mid_begin = sink;
  out.window.mid_end = n - eval;
  out.window.n_mid = out.window.mid_end - out.window.mid_begin;
  out.window.budget = static_cast<int>(std::llround(keep_ratio * out.window.n_mid));
  if (out.window.n_mid == 0) notes.push_back("the middle is empty: nothing to compress");
  out.note = join(notes, "; ");
  return out;
}

std::string EvalWindow::describe() const {
  std::string s = "n=" + std::to_string(n) + " s=" + std::to_string(sink) +
                  " E=" + std::to_string(eval) + " middle=" + std::to_string(n_mid) +
                  " m=" + std::to_string(budget);
  std::vector<std::string> why;
  if (sink_overridden) why.push_back("s set by hand");
  if (eval_overridden) why.push_back("E set by hand");
  if (!sink_overridden && !eval_overridden && scaled_down())
    why.push_back("scaled down from 256/256 for a short capture: s = floor(n/32), E = floor(n/8)");
  else if (scaled_down() && (!sink_overridden || !eval_overridden))
    why.push_back("defaults scaled down for a short capture");
  if (!why.empty()) s += " (" + join(why, "; ") + ")";
  return s;
}

}  // namespace kvscope
