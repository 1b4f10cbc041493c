// Hot double-precision kernels dispatched at run time to the best instruction set the CPU has
// (AVX-512, AVX2+FMA, SSE2, scalar). One source (engine/simd/kernels.inc) is compiled once per
// instruction set; results of every path agree with the scalar one to rounding (tested to 1e-9
// relative in test_simd). With KVSCOPE_NATIVE=ON (the default) the scalar path itself is built
// for the host CPU and the dispatcher still picks the widest table the CPU runs.
//
// Layouts are row-major with explicit row strides ("ld"); sizes are ints.
#pragma once

#include <string>
#include <vector>

namespace kvscope::simd {

struct Kernels {
  const char* name;
  // x[i] = exp(x[i]) (about 1 ulp; results below 2^-1022 are flushed to 0; -inf gives 0).
  void (*exp_inplace)(double* x, int n);
  // x[i] = exp(x[i] - shift); returns the sum of the new x, and their sum of squares in *sum_sq
  // when it is not null.
  double (*exp_shift_sum)(double* x, int n, double shift, double* sum_sq);
  // C[i][j] = alpha * sum_k A[i][k] B[j][k]   (i < M, j < N; A is M x K, B is N x K).
  void (*gemm_abt)(int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                   int ldb, double* C, int ldc);
  // C[i][j] += sum_p A[p][i] B[row(p)][j]   (A is K x M; row(p) = rows[p], or p when rows is
  // null).
  void (*gemm_atb_acc)(int M, int N, int K, const double* A, int lda, const double* B, int ldb,
                       const int* rows, double* C, int ldc);
  // Over the rows x cols block X: m[e] = max(m[e], max_c X[c][e]).
  void (*col_max)(const double* X, int rows, int cols, int ld, double* m);
  // X[c][e] = exp(X[c][e] - m[e]).
  void (*col_exp_sub)(double* X, int rows, int cols, int ld, const double* m);
  // out[e] += sum_c coef[c] X[c][e] (coef null: 1); out_sq[e] += sum_c X[c][e]^2 when not null.
  void (*col_sums)(const double* X, int rows, int cols, int ld, const double* coef, double* out,
                   double* out_sq);
  // The float32 walk's block Gram (engine/balance_walk.cpp); null in the tables without fused
  // multiply-adds (scalar, sse2). Rows i in [ibegin, iend) of G = X X^T for the `rows` rows of X
  // (`dim` features), given packed: G[i][j] = sum_c x_i[c] x_j[c] in float, one accumulator per
  // entry started at 0 and one fused multiply-add per feature in order c = 0, 1, ... (the order
  // of the CUDA walk's gram_tile, so every FMA table and the GPU agree bit for bit), for j from 0
  // through at least i (more columns of the same products up to a multiple of 16). Row i goes to
  // g + (i - ibegin) * ldg; writes rows below iend and columns below `rows` rounded up to 16 (ldg
  // at least that). `packed`: X in panels of 16 rows, feature by feature, x[16t + r][c] at
  // packed[(t * dim + c) * 16 + r], rows past the last repeating it. on_tile(ctx), when not null,
  // runs after each tile of products (prefetch hints).
  void (*walk_gram_f32)(const float* packed, int rows, int dim, int ibegin, int iend, int ldg,
                        float* g, void (*on_tile)(void*), void* ctx);
};

// The table in use: the widest the CPU supports, unless KVSCOPE_SIMD=<name> in the environment
// (or use()) picks another. Thread-safe after the first call.
const Kernels& kernels();
// Names of the tables this CPU can run, narrowest first ("scalar", "sse2", "avx2", "avx512").
std::vector<std::string> available();
// Whether this CPU runs the instruction set of that table ("avx2" means AVX2 with FMA): the one
// place KVScope asks the CPU (the walk's Gram kernels ask here too).
bool cpu_supports(const std::string& name);
// The table of that name; throws std::invalid_argument when the CPU cannot run it or it is not
// built.
const Kernels& table(const std::string& name);
// Makes `name` the table kernels() returns (benchmarks and tests). Not thread-safe.
void use(const std::string& name);

namespace detail {
extern const Kernels scalar_table, sse2_table, avx2_table, avx512_table;
}

}  // namespace kvscope::simd
