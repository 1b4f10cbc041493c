// Greedy k-center (Gonzalez 1985): start from one point, then repeatedly pick the point farthest
// from the centres chosen so far. Its covering radius is at most twice the optimum. Used by
// subgen-kcenter (the SubGen paper's experiment) and the Geometry view's cluster colouring; the
// CPU version here is the reference behind Backend::kcenter (declared in engine/cpu_ops.h).
#pragma once

#include <vector>

#include "engine/tensor.h"

namespace kvscope {

// Centre rows of `x` in pick order (k of them, or all rows when k >= rows). The first pick is row
// `first`; each later pick maximises the Euclidean distance to its nearest chosen centre, ties
// going to the lowest row. Distances in double precision. Throws InputError for k < 0 or `first`
// out of range (when x has rows and k > 0).
std::vector<int> greedy_kcenter(const MatrixF& x, int k, int first = 0);

// Index into `centres` of the nearest centre of every row of x (Voronoi assignment; ties go to
// the earlier centre). Empty when centres is empty.
std::vector<int> assign_to_centres(const MatrixF& x, const std::vector<int>& centres);

// max over rows of the distance to the nearest centre (0 for no rows; +inf for no centres).
double covering_radius(const MatrixF& x, const std::vector<int>& centres);

}  // namespace kvscope
