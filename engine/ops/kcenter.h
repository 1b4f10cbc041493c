// The k-center op (Backend::kcenter, engine/ops/backend.h): its CPU reference, cpu_kcenter
// (engine/ops/kcenter_cpu.cpp). The input is plain arguments (x: n x d row-major floats, k
// centres from row `first`). The CUDA kernel is kernels/kcenter.cu; engine/geometry/kcenter.h
// builds the covering radii and the SubGen figure on top of the op.
#pragma once

#include <vector>

namespace kvscope {

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape kcenter_shape(int n, int d, int k);

// Greedy k-center (Gonzalez): the first pick is row `first`, each later one maximises the
// distance (double precision) to its nearest chosen centre, ties to the lowest row, no row twice;
// min(k, n) picks in pick order. Throws InputError for k < 0, a negative shape, no points, or
// `first` out of range (when n > 0 and k > 0).
std::vector<int> cpu_kcenter(const float* x, int n, int d, int k, int first);

}  // namespace kvscope
