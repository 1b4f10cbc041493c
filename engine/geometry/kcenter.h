// Greedy k-center (Gonzalez 1985): start from one point, then repeatedly pick the point farthest
// from the centres chosen so far. Its covering radius is at most twice the optimum. Used by
// subgen-kcenter (the SubGen paper's experiment) and the Geometry view's cluster colouring; the
// CPU version here is the reference behind Backend::kcenter
// (engine/ops/kcenter.h).
#pragma once

#include <atomic>
#include <vector>

#include "engine/core/tensor.h"

namespace kvscope {

class Backend;

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

// ---- SubGen's Figure 1 (greedy k-center centres on a t-SNE map of keys and of values) and its
// clusterability claim (Definition 1: keys are (m, delta)-clusterable with m sublinear in n).
// The k-center work goes through `backend.kcenter` (the CUDA kernel on a GPU); covering radii and
// counts are computed here in double precision.

// Root mean square distance of the rows to their mean: the scale radii are given in.
double rms_spread(const MatrixF& x);

// How many greedy k-center centres (from row 0, Gonzalez order) cover the rows of x within
// `radius`: the smallest j whose first j picks have covering radius <= radius. Counts stop at
// `cap` (*capped is set when even cap centres do not cover). 0 for no rows.
int kcenter_count_within(Backend& backend, const MatrixF& x, double radius, int cap,
                         bool* capped = nullptr);

struct KCenterFigure {
  std::vector<int> centres;   // the k greedy centres on all rows (pick order, from row 0)
  std::vector<int> owner;     // per row: index into centres of its nearest centre
  double covering = 0;        // covering radius of those centres
  double radius = 0;          // the radius of the cluster counts
  std::vector<int> prefix;    // prefix lengths n: 16, 32, 64, ..., and all rows
  std::vector<int> clusters;  // kcenter_count_within(first n rows, radius, cap) per prefix
  std::vector<int> capped;    // 1 where the count reached the cap without covering
};
// Everything the Geometry view marks and reports for one point set. Throws Cancelled when
// `cancel` is set between prefixes, InputError for k < 1 or radius <= 0.
KCenterFigure kcenter_figure(Backend& backend, const MatrixF& x, int k, double radius, int cap,
                             const std::atomic<bool>* cancel = nullptr);

}  // namespace kvscope
