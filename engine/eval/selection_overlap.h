// How much two methods' kept sets of one head agree (the grid's A/B overlap,
// app/views/view_error.cpp). A selection's kept set is every middle token in its numerator or its
// denominator set (weights aside).
#pragma once

#include <vector>

#include "engine/methods/method.h"

namespace kvscope {

struct KeptOverlap {
  int a = 0, b = 0;  // |A|, |B|
  int both = 0;      // |A n B|
  int either() const { return a + b - both; }
  // |A n B| / |A u B|: 1 when the sets are equal, 0 when disjoint (1 for two empty sets).
  double jaccard() const { return either() == 0 ? 1.0 : static_cast<double>(both) / either(); }
};

// The sorted token indices a selection keeps (indices and den_indices together, each once).
std::vector<int> kept_set(const Selection& sel);
KeptOverlap kept_overlap(const Selection& a, const Selection& b);

}  // namespace kvscope
