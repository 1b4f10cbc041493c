// The evaluation window of docs/evaluation.md: s sinks, the middle a method compresses to m tokens,
// and the last E positions, the evaluation queries, kept as they arrive.
#pragma once

#include <string>

namespace kvscope {

struct EvalWindow {
  int n = 0;
  int sink = 0;       // s
  int eval = 0;       // E
  int mid_begin = 0;  // s
  int mid_end = 0;    // n - E
  int n_mid = 0;
  int budget = 0;  // m = round(keep_ratio * n_mid)
  double keep_ratio = 0.5;
  bool sink_overridden = false, eval_overridden = false;  // set by --sink / --eval
  // s = min(256, floor(n/32)), E = min(256, floor(n/8)) unless overridden (>= 0).
  // Throws InputError naming --ratios / --sink / --eval when the window does not fit n.
  static EvalWindow make(int n, double keep_ratio, int sink_override = -1, int eval_override = -1);
  // Never throws for n >= 1: the window that fits n closest to what was asked (the defaults when
  // an override is negative), with `note` saying what was adjusted and why (empty when nothing
  // was). For callers that must show something for any capture the loader accepts (the app):
  // E is clamped to [1, n], s to [0, n - E]; a capture of one token has an empty middle.
  struct Fitted;
  static Fitted fit(int n, double keep_ratio, int sink_request = -1, int eval_request = -1);
  bool scaled_down() const { return sink < 256 || eval < 256; }
  std::string describe() const;  // "n=512 s=16 E=64 middle=432 m=216 (scaled down from 256/256)"
};

struct EvalWindow::Fitted {
  EvalWindow window;
  std::string note;  // e.g. "--sink 200 does not fit a 64-token capture: s = 56"
};

}  // namespace kvscope
