// What happened to every token of the focused head under one method run: sink, evaluation
// window, kept (with its weight) or dropped. Shared by the Tokens view and any view that colours
// tokens (Geometry), so categories and colours agree everywhere.
#pragma once

#include <cstdint>
#include <vector>

#include "app/colormap.h"
#include "engine/protocol.h"

namespace kvscope::app {

enum class TokenKind : uint8_t { Sink, Window, Kept, Dropped };

struct TokenMarks {
  std::vector<TokenKind> kind;     // [n]
  std::vector<double> weight;      // [n] weight in the estimator (1 for sinks/window, 0 dropped)
  std::vector<double> score;       // [n] the method's ranking score (NaN when none)
  std::vector<double> den_weight;  // [n] denominator weight when the selection is separate
  double max_weight = 1;
  bool separate = false;
};

// Classifies tokens [0, n) by `run` (the numerator selection when it is separate; den_weight
// holds the denominator's).
TokenMarks token_marks(const HeadRun& run);

// The colour of a token in every view: kept tokens shade from pale (weight 1) to full green at
// the largest weight, on a log scale; slot 1 (method B of the A/B comparison) shades in B's
// purple (kColSlot[1]) instead, so stacked A/B strips match their legend.
ImU32 token_colour(const TokenMarks& m, int i, int slot = 0);

const char* token_kind_name(TokenKind k);

}  // namespace kvscope::app
