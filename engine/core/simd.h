// Hot kernels dispatched at run time to the best instruction set the CPU has (AVX-512, AVX2+FMA,
// SSE2, scalar): the engine's one SIMD style. One source (engine/core/simd/kernels.inc) is compiled
// once per instruction set; results of every path agree with the scalar one to rounding (tested
// to 1e-9 relative in test_simd). The hand-written intrinsics of the AVX2 and AVX-512 tables
// (engine/core/simd/intrinsics_*.cpp) are entries of the same tables. With KVSCOPE_NATIVE=ON (the
// default) the scalar path itself is built for the host CPU and the dispatcher still picks the
// widest table the CPU runs. No engine file outside engine/core/simd* uses a target attribute or
// asks the CPU what it runs.
//
// Layouts are row-major with explicit row strides ("ld"); sizes are ints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::simd {

// The brute-force kNN's points (engine/geometry/knn.cpp) as its kernels read them: `rows` row-major
// (d floats each, kKnnRows rows of zero padding after the last), `panels` of kKnnPanel points
// dimension-major (panel t holds, for each dimension c, points 16t .. 16t + 15 at panels[(16t *
// d) + 16c + r]), zero-padded, both 64-byte aligned; `norms` their squared norms, NaN past n.
constexpr int kKnnPanel = 16, kKnnRows = 6, kKnnMaxRank = 16;
struct KnnPoints {
  int n = 0, d = 0;
  const float* rows = nullptr;
  const float* panels = nullptr;
  const float* norms = nullptr;
};

// What exp_atb_acc computes: the softmax's exponentials of a block of logits, their column sums
// and their product with the values (engine/attention/exact_attention.cpp), X read once and never
// written.
struct ExpProduct {
  int M = 0, N = 0, K = 0;
  const double* X = nullptr;  // K x M, row stride ldx
  int ldx = 0;
  const double* bias = nullptr;  // [K]: added to row p of X (a kept token's log weight), or null
  const double* m = nullptr;     // [M]: the shift of each column
  const double* coef = nullptr;  // [K]: wsum[e] += sum_p coef[p] P[p][e] when not null
  double* wsum = nullptr;
  double* sum = nullptr;      // [M]: sum[e] += sum_p P[p][e]
  double* sum_sq = nullptr;   // [M]: sum_sq[e] += sum_p P[p][e]^2 when not null
  const double* B = nullptr;  // K x N, row stride ldb; or, when b_packed is set, B packed by
  int ldb = 0;                // pack_atb_b over b_depth >= K rows (B unused)
  const double* b_packed = nullptr;
  int b_depth = 0;
  double* C = nullptr;  // M x N, row stride ldc: C += P^T B
  int ldc = 0;
};

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
  // C (M x N) += P^T B with P[p][e] = exp(X[p][e] + bias[p] - m[e]), and the sums of P: see
  // ExpProduct. Bit for bit what adding the bias, col_exp_sub, col_sums (each sum its own call)
  // and gemm_atb_acc give one after the other, in one pass over X (the squares fused on every FMA
  // table, where col_sums' may or may not be: GCC's choice).
  void (*exp_atb_acc)(const ExpProduct& e);
  // Operands packed once for several products (the exact side packs a kv head's keys and values
  // once for all its query heads and panels instead of once per product): the products read them
  // as gemm_abt and exp_atb_acc read theirs, so the results are the same bit for bit.
  // packed_size(rows, cols): the doubles either packed form of a rows x cols matrix needs.
  size_t (*packed_size)(int rows, int cols);
  // A (rows x depth, row stride lda), as gemm_abt's A: for gemm_abt_prepacked.
  void (*pack_abt_a)(const double* A, int rows, int depth, int lda, double* dst);
  // B (depth x cols, row stride ldb), as exp_atb_acc's B: its b_packed.
  void (*pack_atb_b)(const double* B, int depth, int cols, int ldb, double* dst);
  // gemm_abt with A packed by pack_abt_a from a_rows >= M rows (the first M are used).
  void (*gemm_abt_prepacked)(int M, int N, int K, double alpha, const double* a_packed, int a_rows,
                             const double* B, int ldb, double* C, int ldc);
  // The float32 walk's block Gram (engine/methods/balancekv/balance_walk.cpp); null in the tables
  // without fused multiply-adds (scalar, sse2). Rows i in [ibegin, iend) of G = X X^T for the
  // `rows` rows of X
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

  // ---- Hand-written x86 intrinsics (engine/core/simd/intrinsics_avx2.cpp, intrinsics_avx512.cpp):
  // null in the scalar and sse2 tables, where the callers run their portable code instead. Unlike
  // the kernels above (contracted: -ffp-contract=fast), these are built with -ffp-contract=off
  // (CMakeLists.txt): multiply-adds are fused only where they say so. The avx512 table uses the
  // AVX2 ones except where it names its own.

  // The double walk's block Gram (engine/ops/walk_blocks_cpu.cpp, preset kvscope-v1):
  // G[i][j] = <x_i, x_j> for rows i in [ibegin, iend) and j <= i (plus a few entries above the
  // diagonal), x row-major `dimp` wide, dimp a multiple of walk_gram_f64_lanes (4; avx512: 8, its
  // own kernel) zero-padded, rows zero-padded to a multiple of 4 (ibegin % 4 == 0, iend % 2 ==
  // 0); row i goes to g + (i - ibegin) * ldg. Sums in lanes of that width: results depend on it.
  int walk_gram_f64_lanes;
  void (*walk_gram_f64)(const double* x, int ibegin, int iend, int dimp, int ldg, double* g);
  // The float32 walk's other steps (set exactly where walk_gram_f32 is). Packs `len` rows of x
  // (`dim` wide) as walk_gram_f32 reads them.
  void (*walk_pack_panels16)(const float* x, int len, int dim, float* out);
  // The kernel entries of rows [p0, p1) (p0 % 16 == 0) of the block from its Gram rows (row r at
  // gk/gv + (r - p0) * ld): out[r * ld + j] = exp((temp * gk) / sqrt_d - beta) *
  // ((gv + eps) + bias) for j <= r (and on to r rounded up to 8, or 16 with the avx512 table's own
  // kernel: the same bits), a polynomial exp within 2 ulp (inf above the float range, 0 below);
  // tail_bad[j] = 1 for each non-finite entry of column j.
  void (*walk_kernel_rows_f32)(const float* gk, const float* gv, int p0, int p1, int ld, float temp,
                               float sqrt_d, float beta, float eps, float bias, float* out,
                               char* tail_bad);
  // sum_{j<i} k[j] s[j] in float: 8 lanes, then the tail in order.
  float (*walk_dot_f32)(const float* k, const float* s, int i);
  // sum[c] = the sum over the rows `tokens` (in order) of rows[token * d + c], in double: the
  // same bits as the plain loop (one chain per column).
  void (*column_sums_f32)(const float* rows, const int* tokens, int count, int d, double* sum);
  // t-SNE's row i of the attraction (fx, fy) and, with kl not null, its KL term and sum_j p_ij
  // (engine/ops/tsne_gradient_cpu.cpp): P in CSR (rowptr, col or col16 when not null, val), y
  // interleaved (x, y); 8 neighbours per step in float lanes summed in double.
  void (*tsne_row_terms)(const float* y, const int* rowptr, const int* col, const uint16_t* col16,
                         const float* val, int i, double* fx, double* fy, double* kl, double* ps);
  // t-SNE's gradient step (engine/geometry/tsne.cpp) on the first multiple of 8 of `size`
  // coordinates, the plain loop's float operations in its order (bit for bit); returns how many it
  // did.
  long (*tsne_gradient_step)(const float* g, float* u, float* gain, float* y, long size,
                             float momentum, float lr, float min_gain);
  // The brute-force kNN's distances |a|^2 + |b|^2 - 2 a.b (engine/geometry/knn.cpp): one fused
  // multiply-add per dimension in order, then the norms fused in; the layout is KnnPoints'. One
  // tile, rows [i0, i1) against columns [j0, j1) (only j > i when i0 == j0): every distance at most
  // threshold[i] or threshold[j] (read as it changes) goes to offer(ctx, i, j, dd, for_row,
  // for_col) in groups of 16 columns, dd their distances, bit c of for_row / for_col set where
  // column j + c is offered to point i / point i to point j + c.
  void (*knn_scan_tile)(const KnnPoints& p, int i0, int i1, int j0, int j1, const float* threshold,
                        void (*offer)(void* ctx, int i, int j, const float* dd, unsigned for_row,
                                      unsigned for_col),
                        void* ctx);
  // estimate[i], i in [i0, i1) (i0 a multiple of kKnnRows): the rank-th (1 <= rank <=
  // kKnnMaxRank) smallest distance from row i to the `sample` points (s.n of them, padded: NaN
  // norms past the last) other than itself (sample_row[t] == i), +inf when fewer.
  void (*knn_sample_ranks)(const KnnPoints& p, const KnnPoints& sample, const int* sample_row,
                           int rank, int i0, int i1, float* estimate);
  // dd[j] for every j < p.n rounded up to 64 (p's panels hold that many): the distance of row i
  // to point j.
  void (*knn_distances)(const KnnPoints& p, int i, float* dd);
};

// The table in use: the widest the CPU supports, unless KVSCOPE_SIMD=<name> in the environment
// (or use()) picks another. Thread-safe after the first call.
const Kernels& kernels();
// Names of the tables this CPU can run, narrowest first ("scalar", "sse2", "avx2", "avx512").
std::vector<std::string> available();
// Whether this CPU runs the instruction set of that table ("avx2" means AVX2 with FMA): the one
// place KVScope asks the CPU. Engine code does not need it (a table in use is one the CPU runs;
// a null entry means the portable path); tests do.
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
