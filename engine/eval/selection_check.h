// The protocol's rules for a method's selection (docs/evaluation.md), shared by the evaluation
// protocol (engine/eval/protocol.cpp) and compressed-cache generation (engine/model/generate.cpp):
// a bug in a method must fail loudly, not turn into a plausible-looking error figure or divergence.
#pragma once

#include "engine/methods/method.h"

namespace kvscope {

// Throws std::runtime_error naming the method when `sel` breaks a rule: every index (and every
// denominator index when sel.separate) lies in the middle [mid_begin, mid_end) and appears once,
// each has one positive finite weight, and a method that respects the budget keeps at most
// `budget` indices. `unit` is what an index counts, for the messages.
enum class SelectionUnit { Token, CacheEntry };  // a capture's token, a generation cache's entry
void check_selection(const Selection& sel, int mid_begin, int mid_end, int budget,
                     const Method& method, SelectionUnit unit = SelectionUnit::Token);

}  // namespace kvscope
