// What happened to every token of the focused head under one method run: sink, evaluation
// window, kept (with its weight) or dropped. Shared by the Tokens view and any view that colours
// tokens (Geometry), so categories and colours agree everywhere.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "app/colormap.h"
#include "engine/eval/protocol.h"
#include "engine/eval/token_harm.h"

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

// One pixel column of the Tokens view's overview strip: tokens [first, last) of the sequence.
struct OverviewBin {
  int first = 0, last = 0;
  int middle = 0;             // tokens of the middle (the ones a method may drop)
  int sinks = 0, window = 0;  // always-kept tokens
  std::array<int, 2> kept{};  // middle tokens kept by A and by B
  double weight_sum = 0;      // A's weights over its kept tokens of the bin
  double mass = 0;            // sum of the mean exact attention (TokenHarm::mass)
  double harm = 0;            // sum of the middle tokens' harm (TokenHarm::harm)
};

// The whole sequence [0, n) binned into `columns` columns (fewer when n is smaller: one token
// each), bin c holding tokens [c n / columns, (c + 1) n / columns). Any of a, b, harm may be null.
std::vector<OverviewBin> overview_bins(int n, int columns, const TokenMarks* a, const TokenMarks* b,
                                       const TokenHarm* harm);

// The harm colour: magma on a log scale over [lo, hi]; harm <= lo is darkest.
ImU32 harm_colour(double harm, double lo, double hi);
// The log scale's ends for a TokenHarm: its largest positive harm and 1e-4 of it (or the
// smallest positive one when that is larger). Both 0 when no token has positive harm.
void harm_range(const TokenHarm& h, double* lo, double* hi);

}  // namespace kvscope::app
