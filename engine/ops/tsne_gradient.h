// The t-SNE gradient op (Backend::tsne_gradient, engine/ops/backend.h): its input type and its CPU
// reference, cpu_tsne_gradient (engine/ops/tsne_gradient_cpu.cpp: exact, Barnes-Hut, and the
// FFT-interpolated variant fft_tsne_gradient of engine/ops/tsne_gradient_fft.h). The CUDA kernel is
// kernels/tsne_gradient.cu. The optimisation around it is engine/geometry/tsne.h's TsneRun.
#pragma once

#include <cstdint>

namespace kvscope {

// t-SNE gradient: P is a symmetric, normalised sparse affinity matrix in CSR form.
struct TsneGradInput {
  int n = 0;
  const float* y = nullptr;  // n x 2
  const int* p_rowptr = nullptr;
  const int* p_col = nullptr;
  const float* p_val = nullptr;
  // Optional: the same columns as 16-bit indices (n <= 65536), which the CPU's attraction reads
  // instead of p_col (a quarter less of P streamed from memory every iteration).
  const uint16_t* p_col16 = nullptr;
  double exaggeration = 1;
  double theta = 0;  // Barnes-Hut opening angle; 0 = exact O(n^2)
  // Whether the caller wants the KL divergence returned (a log per P entry: skipped on most
  // iterations by TsneRun). A backend may compute it anyway or return NaN when false.
  bool want_kl = true;
};

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const TsneGradInput& in);

// The CPU reference. grad: n x 2. Returns KL(P || Q) of the un-exaggerated P (with the
// Barnes-Hut estimate of Z when theta > 0), or NaN when !in.want_kl; 0 for n <= 0.
double cpu_tsne_gradient(const TsneGradInput& in, float* grad);
// The t-SNE attraction and KL rows (and TsneRun's gradient step) use the SIMD table's AVX2 kernels
// where the table in use has them (engine/core/simd.h); false forces the portable scalar path
// (tests compare the two). Returns the previous setting.
bool set_cpu_tsne_simd(bool enabled);
// Whether those AVX2 paths run now: the SIMD table in use has them (avx2, avx512) and
// set_cpu_tsne_simd has not turned them off.
bool cpu_tsne_avx2_in_use();

}  // namespace kvscope
