// The CPU implementations behind the Backend seam, one per module that owns the maths:
// walk (ops/walk_blocks_cpu.cpp), attention error (attention.cpp), t-SNE gradient (tsne.cpp),
// k-center (kcenter.cpp). They are the double-precision references the CUDA kernels are tested
// against.
#pragma once

#include "engine/backend.h"

namespace kvscope {

void cpu_walk_blocks(const WalkBatch& batch);
void cpu_attention_errors(const ErrorBatch& batch);
double cpu_tsne_gradient(const TsneGradInput& in, float* grad);
// The t-SNE attraction and KL rows use AVX2 where the CPU has it; false forces the portable
// scalar path (tests compare the two). Returns the previous setting.
bool set_cpu_tsne_simd(bool enabled);
std::vector<int> cpu_kcenter(const float* x, int n, int d, int k, int first);

}  // namespace kvscope
