// The run-time dispatched SIMD kernels (engine/core/simd.h): every table this CPU runs agrees with
// the portable scalar one to 1e-9 relative, kernel by kernel and through the exact reference and
// scoring that use them; exp matches libm to a few ulp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "engine/attention/exact_attention.h"
#include "engine/core/simd.h"
#include "engine/eval/protocol.h"
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/ops/walk_blocks.h"

namespace kvscope {
#if defined(KVSCOPE_TEST_WIDE_ON_AVX2)
namespace simd::detail {
extern const Kernels avx512_width_on_avx2_table;  // tests/simd_wide_on_avx2.cpp
}
#endif
namespace {

std::vector<double> random_vector(size_t n, std::mt19937& rng, double scale = 1) {
  std::normal_distribution<double> nd(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = nd(rng);
  return v;
}

void expect_close(const std::vector<double>& want, const std::vector<double>& got,
                  const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_LE(std::abs(want[i] - got[i]),
              1e-9 * std::max(std::abs(want[i]), std::abs(got[i])) + 1e-300)
        << what << " entry " << i << ": " << want[i] << " vs " << got[i];
}

TEST(Simd, ScalarTableIsAlwaysAvailable) {
  const std::vector<std::string> names = simd::available();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "scalar");
  EXPECT_STREQ(simd::table("scalar").name, "scalar");
  EXPECT_THROW(simd::table("no-such-isa"), std::invalid_argument);
}

TEST(Simd, ExpMatchesLibm) {
  std::vector<double> x;
  for (int i = 0; i <= 20000; ++i) x.push_back(-708.0 + 1416.0 * i / 20000);
  x.push_back(0.0);
  x.push_back(-1e-300);
  for (const std::string& name : simd::available()) {
    std::vector<double> y = x;
    simd::table(name).exp_inplace(y.data(), static_cast<int>(y.size()));
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::abs(y[i] - std::exp(x[i])), 4e-16 * std::exp(x[i])) << name << " x=" << x[i];
    double z[3] = {-INFINITY, -800.0, -745.2};
    simd::table(name).exp_inplace(z, 3);
    EXPECT_EQ(z[0], 0.0) << name;
    EXPECT_EQ(z[1], 0.0) << name;
    EXPECT_EQ(z[2], 0.0) << name;  // libm's subnormals are flushed
  }
}

TEST(Simd, EveryTableMatchesScalar) {
  const simd::Kernels& ref = simd::table("scalar");
  for (const std::string& name : simd::available()) {
    const simd::Kernels& k = simd::table(name);
    std::mt19937 rng(7);
    // Odd sizes exercise every tail of the blocked loops.
    for (int M : {1, 5, 37, 70})
      for (int N : {1, 3, 13, 36})
        for (int K : {1, 7, 8, 33, 128, 300}) {  // 300: more than one packed depth chunk
          const auto A = random_vector(static_cast<size_t>(M) * K, rng);
          const auto B = random_vector(static_cast<size_t>(N) * K, rng);
          std::vector<double> c0(static_cast<size_t>(M) * N), c1(c0.size());
          ref.gemm_abt(M, N, K, 0.3, A.data(), K, B.data(), K, c0.data(), N);
          k.gemm_abt(M, N, K, 0.3, A.data(), K, B.data(), K, c1.data(), N);
          // Dot products may cancel: compare against the scale of the terms.
          for (size_t i = 0; i < c0.size(); ++i)
            ASSERT_LE(std::abs(c0[i] - c1[i]), 1e-9 * 0.3 * K) << name << " gemm_abt";
          // A packed once (here over 70 more rows, of which the product reads the first M):
          // the same products bit for bit.
          {
            auto A_long = A;
            const auto extra = random_vector(static_cast<size_t>(70) * K, rng);
            A_long.insert(A_long.end(), extra.begin(), extra.end());
            std::vector<double> A_packed(k.packed_size(M + 70, K));
            k.pack_abt_a(A_long.data(), M + 70, K, K, A_packed.data());
            std::vector<double> c2(c1.size());
            k.gemm_abt_prepacked(M, N, K, 0.3, A_packed.data(), M + 70, B.data(), K, c2.data(), N);
            ASSERT_EQ(c1, c2) << name << " gemm_abt_prepacked M=" << M << " N=" << N << " K=" << K;
          }

          // C (M x N) += A^T B with A: K x M, B rows picked in reverse.
          const auto At = random_vector(static_cast<size_t>(K) * M, rng);
          const auto Bk = random_vector(static_cast<size_t>(K) * N, rng);
          std::vector<int> rows(K);
          for (int p = 0; p < K; ++p) rows[p] = K - 1 - p;
          std::vector<double> d0 = random_vector(static_cast<size_t>(M) * N, rng), d1 = d0;
          ref.gemm_atb_acc(M, N, K, At.data(), M, Bk.data(), N, rows.data(), d0.data(), N);
          k.gemm_atb_acc(M, N, K, At.data(), M, Bk.data(), N, rows.data(), d1.data(), N);
          for (size_t i = 0; i < d0.size(); ++i)
            ASSERT_LE(std::abs(d0[i] - d1[i]), 1e-9 * K) << name << " gemm_atb_acc";
        }
    for (int rows : {1, 9, 64, 300})
      for (int cols : {1, 3, 8, 61, 70}) {
        auto X = random_vector(static_cast<size_t>(rows) * cols, rng, 3.0);
        const auto coef = random_vector(rows, rng);
        std::vector<double> m0(cols, -INFINITY), m1 = m0;
        ref.col_max(X.data(), rows, cols, cols, m0.data());
        k.col_max(X.data(), rows, cols, cols, m1.data());
        EXPECT_EQ(m0, m1) << name << " col_max";
        auto X0 = X, X1 = X;
        ref.col_exp_sub(X0.data(), rows, cols, cols, m0.data());
        k.col_exp_sub(X1.data(), rows, cols, cols, m0.data());
        expect_close(X0, X1, name + " col_exp_sub");
        std::vector<double> s0(cols, 1.0), s1 = s0, q0(cols, 0.0), q1 = q0;
        ref.col_sums(X0.data(), rows, cols, cols, coef.data(), s0.data(), q0.data());
        k.col_sums(X0.data(), rows, cols, cols, coef.data(), s1.data(), q1.data());
        for (int e = 0; e < cols; ++e) ASSERT_NEAR(s0[e], s1[e], 1e-9 * (rows + 1)) << name;
        expect_close(q0, q1, name + " col_sums squares");
        // exp_atb_acc: exp, the sums and the product with the values in one pass, bit for bit
        // what the three separate kernels give (its own table), X left as it is; every variant of
        // the sums, several packed depth chunks (rows 300), row blocks (cols 70) and a masked key.
        for (const int N : {1, 13, 36}) {
          auto Xm = X;
          if (rows > 1) Xm[static_cast<size_t>(rows - 1) * cols] = -INFINITY;  // a masked key
          // The values, and the same values packed once over 131 more rows, of which the
          // product reads the first `rows` (as the exact side reads a prefix of the keys).
          const auto V = random_vector(static_cast<size_t>(rows + 131) * N, rng);
          std::vector<double> V_packed(k.packed_size(rows + 131, N));
          k.pack_atb_b(V.data(), rows + 131, N, N, V_packed.data());
          for (const bool weighted : {false, true})
            for (const bool squares : {false, true}) {
              auto Xa = Xm;
              std::vector<double> s0(cols, 0.5), q0(cols, 0.25), w0(cols, 0.125);
              auto s1 = s0, q1 = q0, w1 = w0;
              const auto s0_start = s0, q0_start = q0, w0_start = w0;
              std::vector<double> C0 = random_vector(static_cast<size_t>(cols) * N, rng), C1 = C0;
              const auto C0_start = C0;
              k.col_exp_sub(Xa.data(), rows, cols, cols, m0.data());
              if (weighted)
                k.col_sums(Xa.data(), rows, cols, cols, coef.data(), w0.data(), nullptr);
              k.col_sums(Xa.data(), rows, cols, cols, nullptr, s0.data(),
                         squares ? q0.data() : nullptr);
              k.gemm_atb_acc(cols, N, rows, Xa.data(), cols, V.data(), N, nullptr, C0.data(), N);
              const auto Xb = Xm;
              simd::ExpProduct e;
              e.M = cols;
              e.N = N;
              e.K = rows;
              e.X = Xb.data();
              e.ldx = cols;
              e.m = m0.data();
              e.coef = weighted ? coef.data() : nullptr;
              e.wsum = w1.data();
              e.sum = s1.data();
              e.sum_sq = squares ? q1.data() : nullptr;
              e.B = V.data();
              e.ldb = N;
              e.C = C1.data();
              e.ldc = N;
              k.exp_atb_acc(e);
              auto C2 = C0_start, s2 = s0_start, q2 = q0_start, w2 = w0_start;
              simd::ExpProduct packed = e;  // the values packed once instead
              packed.B = nullptr;
              packed.b_packed = V_packed.data();
              packed.b_depth = rows + 131;
              packed.wsum = w2.data();
              packed.sum = s2.data();
              packed.sum_sq = squares ? q2.data() : nullptr;
              packed.C = C2.data();
              k.exp_atb_acc(packed);
              // A bias added to each row of X, as scoring adds each kept token's log weight:
              // the same as X with the bias added beforehand.
              auto Xc = Xm;
              const auto bias = random_vector(rows, rng);
              for (int p = 0; p < rows; ++p)
                for (int c = 0; c < cols; ++c) Xc[static_cast<size_t>(p) * cols + c] += bias[p];
              auto C3 = C0_start, C4 = C0_start, s3 = s0_start, s4 = s0_start, q3 = q0_start,
                   q4 = q0_start, w3 = w0_start, w4 = w0_start;
              simd::ExpProduct added = e, biased = e;
              added.X = Xc.data();
              added.wsum = w3.data();
              added.sum = s3.data();
              added.sum_sq = squares ? q3.data() : nullptr;
              added.C = C3.data();
              k.exp_atb_acc(added);
              biased.bias = bias.data();
              biased.wsum = w4.data();
              biased.sum = s4.data();
              biased.sum_sq = squares ? q4.data() : nullptr;
              biased.C = C4.data();
              k.exp_atb_acc(biased);
              const std::string what = name + " exp_atb_acc N=" + std::to_string(N) +
                                       (weighted ? " weighted" : "") + (squares ? " squares" : "");
              EXPECT_EQ(Xb, Xm) << what << ": X changed";
              EXPECT_EQ(C0, C1) << what << " product";
              EXPECT_EQ(s0, s1) << what << " sums";
              // The squares may differ in the last bit: col_sums' x * x + s2 is fused on some
              // tables and not on others (GCC's choice), exp_atb_acc's on every FMA table.
              expect_close(q0, q1, what + " squares");
              EXPECT_EQ(w0, w1) << what << " weighted sums";
              EXPECT_EQ(C1, C2) << what << " with the values packed once";
              EXPECT_EQ(s1, s2) << what << " sums with the values packed once";
              EXPECT_EQ(q1, q2) << what << " squares with the values packed once";
              EXPECT_EQ(w1, w2) << what << " weighted sums with the values packed once";
              EXPECT_EQ(C3, C4) << what << " with a bias per row";
              EXPECT_EQ(s3, s4) << what << " sums with a bias per row";
              EXPECT_EQ(q3, q4) << what << " squares with a bias per row";
              EXPECT_EQ(w3, w4) << what << " weighted sums with a bias per row";
            }
        }
        auto x0 = random_vector(cols, rng, 4.0), x1 = x0;
        double sq0 = 0, sq1 = 0;
        const double t0 = ref.exp_shift_sum(x0.data(), cols, 2.0, &sq0);
        const double t1 = k.exp_shift_sum(x1.data(), cols, 2.0, &sq1);
        expect_close(x0, x1, name + " exp_shift_sum");
        expect_close({t0, sq0}, {t1, sq1}, name + " exp_shift_sum sums");
      }
  }
}

// The exact reference and the scoring of a weighted, separate selection give the same errors on
// every table as on the scalar one.
TEST(Simd, ScoringMatchesScalarOnEveryTable) {
  const int n = 300, d = 16, dv = 12, sink = 9, eval = 37;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  MatrixF K(n, d), V(n, dv), Q1(n, d), Q2(n, d);
  for (MatrixF* m : {&K, &V, &Q1, &Q2})
    for (Eigen::Index i = 0; i < m->size(); ++i) m->data()[i] = nd(rng);
  Selection sel;
  sel.separate = true;
  for (int i = sink; i < n - eval; i += 3) {
    sel.indices.push_back(i);
    sel.weights.push_back(1.0 + (i % 7) * 0.5);
  }
  for (int i = sink + 1; i < n - eval; i += 4) {
    sel.den_indices.push_back(i);
    sel.den_weights.push_back(2.0 + (i % 5));
  }
  Selection plain;
  for (int i = sink; i < n - eval; i += 2) {
    plain.indices.push_back(i);
    plain.weights.push_back(0.5 + (i % 3));
  }
  auto errors = [&](const std::string& name) {
    simd::use(name);
    const ExactReference ref({&Q1, &Q2}, K, V, sink, eval);
    std::vector<double> out;
    for (const Selection* s : {&sel, &plain})
      for (const auto& head : ref.evaluate(*s))
        for (const QueryError& e : head) {
          out.push_back(e.relative);
          out.push_back(e.normalized);
          out.push_back(e.mass);
        }
    return out;
  };
  const std::vector<double> want = errors("scalar");
  for (const std::string& name : simd::available()) expect_close(want, errors(name), name);
  simd::use(simd::available().back());
}

}  // namespace
}  // namespace kvscope

namespace kvscope {
namespace {

// ---- The float32 walk's block Gram (Kernels::walk_gram_f32). Every FMA table, the AVX-512 code at
// its width (built for AVX2 here), and cpu_walk_gram_f32 give each lower-triangle entry exactly
// the float sum of fused multiply-adds in feature order, the CUDA walk's order.

std::vector<float> random_floats(size_t n, std::mt19937& rng, float offset) {
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng) + offset;
  return v;
}

float fused_dot(const float* a, const float* b, int dim) {
  float acc = 0.0f;
  for (int c = 0; c < dim; ++c) acc = std::fmaf(a[c], b[c], acc);
  return acc;
}

// The packed layout engine/core/simd.h documents, written plainly.
std::vector<float> pack_rows(const std::vector<float>& x, int rows, int dim) {
  const int ld = (rows + 15) / 16 * 16;
  std::vector<float> p(static_cast<size_t>(ld) * dim);
  for (int t = 0; t < ld / 16; ++t)
    for (int c = 0; c < dim; ++c)
      for (int r = 0; r < 16; ++r)
        p[(static_cast<size_t>(t) * dim + c) * 16 + r] =
            x[static_cast<size_t>(std::min(16 * t + r, rows - 1)) * dim + c];
  return p;
}

bool cpu_has_avx2_fma() {
  return simd::cpu_supports("avx2");  // AVX2 with FMA (engine/core/simd.h)
}

TEST(Simd, WalkGramIsTheFusedFeatureOrderSumOnEveryFmaTable) {
  std::vector<std::pair<std::string, const simd::Kernels*>> tables;
  for (const std::string& name : simd::available())
    if (simd::table(name).walk_gram_f32) tables.emplace_back(name, &simd::table(name));
#if defined(KVSCOPE_TEST_WIDE_ON_AVX2)
  if (cpu_has_avx2_fma())
    tables.emplace_back("avx512 at its width", &simd::detail::avx512_width_on_avx2_table);
#endif
  if (tables.empty()) GTEST_SKIP() << "no table with fused multiply-adds on this CPU";
  std::mt19937 rng(17);
  int checked = 0;
  for (const int rows : {1, 5, 16, 37, 128, 133})
    for (const int dim : {1, 7, 64, 72, 128}) {
      const std::vector<float> x = random_floats(static_cast<size_t>(rows) * dim, rng, 0.3f);
      const std::vector<float> packed = pack_rows(x, rows, dim);
      const int ld = (rows + 15) / 16 * 16;
      for (const auto& [name, t] : tables)
        // The whole block at once, and in row panels that start mid-tile (as long blocks are).
        for (const int panel : {rows, 66, 12}) {
          std::vector<float> g(static_cast<size_t>(panel) * ld, -1.0f);
          for (int p0 = 0; p0 < rows; p0 += panel) {
            const int p1 = std::min(rows, p0 + panel);
            t->walk_gram_f32(packed.data(), rows, dim, p0, p1, ld, g.data(), nullptr, nullptr);
            for (int i = p0; i < p1; ++i)
              for (int j = 0; j <= i; ++j) {
                const float want = fused_dot(&x[static_cast<size_t>(i) * dim],
                                             &x[static_cast<size_t>(j) * dim], dim);
                const float got = g[static_cast<size_t>(i - p0) * ld + j];
                ASSERT_EQ(want, got) << name << ": rows " << rows << " dim " << dim << " panel "
                                     << panel << " entry (" << i << ", " << j << ")";
                ++checked;
              }
          }
        }
    }
  EXPECT_GT(checked, 0);
}

TEST(Simd, WalkGramOfTheCpuWalkIsTheFusedSumWhereTheTableHasIt) {
  std::mt19937 rng(5);
  const int rows = 45, dim = 40, ldg = 47;
  const std::vector<float> x = random_floats(static_cast<size_t>(rows) * dim, rng, -0.2f);
  std::vector<float> g(static_cast<size_t>(rows) * ldg, 0.0f);
  cpu_walk_gram_f32(x.data(), rows, dim, g.data(), ldg);
  const bool fused = simd::kernels().walk_gram_f32 && cpu_has_avx2_fma();
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j <= i; ++j) {
      const float* a = &x[static_cast<size_t>(i) * dim];
      const float* b = &x[static_cast<size_t>(j) * dim];
      float plain = 0.0f;
      for (int c = 0; c < dim; ++c) plain += a[c] * b[c];
      const float got = g[static_cast<size_t>(i) * ldg + j];
      if (fused)
        ASSERT_EQ(fused_dot(a, b, dim), got) << "entry (" << i << ", " << j << ")";
      else
        ASSERT_NEAR(plain, got, 1e-5f * (1 + std::abs(plain)))
            << "entry (" << i << ", " << j << ")";
    }
  // The portable path: separate multiplies and adds, a rounding or so apart.
  const bool before = set_cpu_walk_simd(false);
  std::vector<float> gp(g.size(), 0.0f);
  cpu_walk_gram_f32(x.data(), rows, dim, gp.data(), ldg);
  set_cpu_walk_simd(before);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j <= i; ++j)
      ASSERT_NEAR(g[static_cast<size_t>(i) * ldg + j], gp[static_cast<size_t>(i) * ldg + j],
                  1e-5f * (1 + std::abs(gp[static_cast<size_t>(i) * ldg + j])));
}

// The intrinsics entries (engine/core/simd/intrinsics_*.cpp) are set exactly in the FMA tables, all
// together: their callers take a null entry for "run the portable code".
TEST(Simd, IntrinsicsEntriesAreSetExactlyInTheFmaTables) {
  for (const std::string& name : simd::available()) {
    const simd::Kernels& t = simd::table(name);
    const bool fma = name == "avx2" || name == "avx512";
    const std::vector<std::pair<const char*, bool>> entries = {
        {"walk_gram_f64", t.walk_gram_f64 != nullptr},
        {"walk_pack_panels16", t.walk_pack_panels16 != nullptr},
        {"walk_kernel_rows_f32", t.walk_kernel_rows_f32 != nullptr},
        {"walk_dot_f32", t.walk_dot_f32 != nullptr},
        {"column_sums_f32", t.column_sums_f32 != nullptr},
        {"tsne_row_terms", t.tsne_row_terms != nullptr},
        {"tsne_gradient_step", t.tsne_gradient_step != nullptr},
        {"knn_scan_tile", t.knn_scan_tile != nullptr},
        {"knn_sample_ranks", t.knn_sample_ranks != nullptr},
        {"knn_distances", t.knn_distances != nullptr}};
    for (const auto& [entry, set] : entries) EXPECT_EQ(fma, set) << name << "." << entry;
    EXPECT_EQ(fma, t.walk_gram_f32 != nullptr) << name;
    EXPECT_EQ(name == "avx2" ? 4 : name == "avx512" ? 8 : 0, t.walk_gram_f64_lanes) << name;
  }
}

// Where an entry promises the plain loop's bits (column sums, the t-SNE step) it gives them; the
// rest agree with plain arithmetic to rounding, and the avx512 table's own kernel rows are the
// avx2 table's bits.
TEST(Simd, IntrinsicsMatchTheirPlainLoops) {
  std::vector<const simd::Kernels*> tables;
  for (const std::string& name : simd::available())
    if (simd::table(name).column_sums_f32) tables.push_back(&simd::table(name));
  if (tables.empty()) GTEST_SKIP() << "no table with intrinsics on this CPU";
  std::mt19937 rng(23);
  const int n = 61, d = 77;  // 32-, 4- and 1-column parts
  const std::vector<float> rows = random_floats(static_cast<size_t>(n) * d, rng, 0.5f);
  std::vector<int> tokens;
  for (int i = n - 1; i >= 0; i -= 2) tokens.push_back(i);
  std::vector<double> want(d, 0.0);
  for (const int tok : tokens)
    for (int c = 0; c < d; ++c) want[c] += rows[static_cast<size_t>(tok) * d + c];
  for (const simd::Kernels* t : tables) {
    std::vector<double> got(d, -1.0);
    t->column_sums_f32(rows.data(), tokens.data(), static_cast<int>(tokens.size()), d, got.data());
    for (int c = 0; c < d; ++c) ASSERT_EQ(want[c], got[c]) << t->name << " column " << c;

    // The t-SNE step: gains up and down, clamped at min_gain, on the first multiple of 8.
    const long size = 101;
    std::vector<float> g = random_floats(size, rng, 0.0f), u = random_floats(size, rng, 0.0f);
    std::vector<float> gain = random_floats(size, rng, 1.0f), y = random_floats(size, rng, 0.0f);
    std::vector<float> g2 = g, u2 = u, gain2 = gain, y2 = y;
    const float momentum = 0.8f, lr = 0.5f, min_gain = 0.95f;  // terms of one size
    const long done = t->tsne_gradient_step(g.data(), u.data(), gain.data(), y.data(), size,
                                            momentum, lr, min_gain);
    ASSERT_EQ(size / 8 * 8, done) << t->name;
    for (long c = 0; c < done; ++c) {
      gain2[c] = (u2[c] * g2[c] < 0) ? gain2[c] + 0.2f : gain2[c] * 0.8f;
      gain2[c] = std::max(gain2[c], min_gain);
      u2[c] = momentum * u2[c] - lr * gain2[c] * g2[c];
      y2[c] += u2[c];
      ASSERT_EQ(gain2[c], gain[c]) << t->name << " coordinate " << c;
      ASSERT_EQ(u2[c], u[c]) << t->name << " coordinate " << c;
      ASSERT_EQ(y2[c], y[c]) << t->name << " coordinate " << c;
    }

    // The double walk's Gram: rows zero-padded to 4, dim to the table's lanes.
    const int lanes = t->walk_gram_f64_lanes, len = 22, dim = 13;
    const int dimp = (dim + lanes - 1) / lanes * lanes;
    std::vector<double> x(static_cast<size_t>(24) * dimp, 0.0);
    for (int i = 0; i < len; ++i)
      for (int c = 0; c < dim; ++c) x[static_cast<size_t>(i) * dimp + c] = rows[i * d + c];
    std::vector<double> gram(static_cast<size_t>(len) * 24, 0.0);
    t->walk_gram_f64(x.data(), 0, len, dimp, 24, gram.data());
    for (int i = 0; i < len; ++i)
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int c = 0; c < dim; ++c) dot += x[i * dimp + c] * x[j * dimp + c];
        ASSERT_NEAR(dot, gram[i * 24 + j], 1e-12 * (1 + std::abs(dot))) << t->name;
      }

    // The sign loop's dot product, every tail length.
    for (int i = 0; i <= 40; ++i) {
      float dot = 0;
      for (int j = 0; j < i; ++j) dot += rows[j] * rows[d + j];
      ASSERT_NEAR(dot, t->walk_dot_f32(rows.data(), rows.data() + d, i),
                  1e-5f * (1 + std::abs(dot)))
          << t->name;
    }

    // Kernel rows of a 40-row block from made-up Gram rows (one entry overflows exp).
    const int ld = 48, p0 = 0, p1 = 40;
    std::vector<float> gk = random_floats(static_cast<size_t>(p1) * ld, rng, 0.0f);
    const std::vector<float> gv = random_floats(static_cast<size_t>(p1) * ld, rng, 0.5f);
    gk[static_cast<size_t>(30) * ld + 7] = 1e4f;
    std::vector<float> kern(static_cast<size_t>(p1) * ld, 0.0f), avx2(kern.size(), 0.0f);
    std::vector<char> bad(p1, 0), bad2(p1, 0);
    const float temp = 2.0f, sqrt_d = 8.0f, beta = 0.5f, eps = 1e-8f, bias = 0.025f;
    t->walk_kernel_rows_f32(gk.data(), gv.data(), p0, p1, ld, temp, sqrt_d, beta, eps, bias,
                            kern.data(), bad.data());
    simd::table("avx2").walk_kernel_rows_f32(gk.data(), gv.data(), p0, p1, ld, temp, sqrt_d, beta,
                                             eps, bias, avx2.data(), bad2.data());
    for (int i = 0; i < p1; ++i) {
      EXPECT_EQ(i == 7, bad[i] != 0) << t->name << " column " << i;
      EXPECT_EQ(bad2[i], bad[i]) << t->name << " column " << i;
      for (int j = 0; j <= i; ++j) {
        const size_t at = static_cast<size_t>(i) * ld + j;
        const float arg = (temp * gk[at]) / sqrt_d - beta;
        const float plain = std::exp(arg) * ((gv[at] + eps) + bias);
        const float got = kern[at];
        ASSERT_EQ(0, std::memcmp(&avx2[at], &got, sizeof got))
            << t->name << " (" << i << ", " << j << ")";
        if (std::isfinite(plain))
          ASSERT_NEAR(plain, got, 5e-7f * std::abs(plain))
              << t->name << " (" << i << ", " << j << ")";
        else
          ASSERT_FALSE(std::isfinite(got)) << t->name << " (" << i << ", " << j << ")";
      }
    }
  }
}

// The kNN kernels: every distance the tile kernel offers is the one knn_distances recomputes,
// bit for bit (engine/geometry/knn.cpp relies on it for points whose sampled estimate was too
// tight), and both are |a - b|^2 to float rounding.
TEST(Simd, KnnRecomputationIsTheTileKernelsDistance) {
  const simd::Kernels& t = simd::kernels();
  if (!t.knn_scan_tile) GTEST_SKIP() << "the table in use has no kNN kernels";
  std::mt19937 rng(31);
  const int n = 70, d = 40, padded = 128;  // a multiple of 64 covering n
  const std::vector<float> x = random_floats(static_cast<size_t>(n) * d, rng, 0.2f);
  auto aligned = [](size_t count) {
    return std::unique_ptr<float[], void (*)(float*)>(
        static_cast<float*>(::operator new[](count * sizeof(float), std::align_val_t(64))),
        [](float* p) { ::operator delete[](p, std::align_val_t(64)); });
  };
  auto rows = aligned(static_cast<size_t>(n + simd::kKnnRows) * d);
  auto panels = aligned(static_cast<size_t>(padded) * d);
  auto norms = aligned(padded + simd::kKnnRows);
  std::fill(rows.get(), rows.get() + static_cast<size_t>(n + simd::kKnnRows) * d, 0.0f);
  std::fill(panels.get(), panels.get() + static_cast<size_t>(padded) * d, 0.0f);
  std::fill(norms.get(), norms.get() + padded + simd::kKnnRows, std::nanf(""));
  for (int i = 0; i < n; ++i) {
    float nn = 0;
    for (int c = 0; c < d; ++c) {
      const float v = x[static_cast<size_t>(i) * d + c];
      rows[static_cast<size_t>(i) * d + c] = v;
      panels[static_cast<size_t>(i / 16) * 16 * d + c * 16 + i % 16] = v;
      nn += v * v;
    }
    norms[i] = nn;
  }
  const simd::KnnPoints p{n, d, rows.get(), panels.get(), norms.get()};
  std::vector<float> threshold(padded + 16, std::numeric_limits<float>::infinity());
  std::vector<float> tile(static_cast<size_t>(n) * padded, std::nanf(""));
  struct Ctx {
    std::vector<float>* tile;
    int padded;
  } ctx{&tile, padded};
  auto offer = [](void* c, int i, int j0, const float* dd, unsigned for_row, unsigned) {
    auto* cx = static_cast<Ctx*>(c);
    for (int k = 0; k < 16; ++k)
      if (for_row >> k & 1) (*cx->tile)[static_cast<size_t>(i) * cx->padded + j0 + k] = dd[k];
  };
  t.knn_scan_tile(p, 0, n, 0, padded, threshold.data(), offer, &ctx);
  std::vector<float> all(padded);
  int checked = 0;
  for (int i = 0; i < n; ++i) {
    t.knn_distances(p, i, all.data());
    for (int j = i + 1; j < n; ++j) {
      const float got = tile[static_cast<size_t>(i) * padded + j];
      ASSERT_EQ(0, std::memcmp(&got, &all[j], sizeof got)) << "pair (" << i << ", " << j << ")";
      double exact = 0;
      for (int c = 0; c < d; ++c) {
        const double diff = double(x[i * d + c]) - x[j * d + c];
        exact += diff * diff;
      }
      ASSERT_NEAR(exact, got, 1e-5 * (1 + norms[i] + norms[j]));
      ++checked;
    }
  }
  EXPECT_EQ(n * (n - 1) / 2, checked);
}

}  // namespace
}  // namespace kvscope
