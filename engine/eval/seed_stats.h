// The mean and spread over seeds that every error figure reports (engine/eval/protocol.cpp); the
// app's grid (app/grid_cells.cpp) uses the same function, so its cells are eval's to the last bit.
#pragma once

#include <utility>
#include <vector>

namespace kvscope {

// Mean and sample standard deviation (n - 1 in the denominator; 0 for a single value, and 0 for
// identical values: a deterministic method has no spread, so rounding noise is not reported).
std::pair<double, double> mean_std(const std::vector<double>& x);

}  // namespace kvscope
