// The run-time dispatched SIMD kernels (engine/simd.h): every table this CPU runs agrees with the
// portable scalar one to 1e-9 relative, kernel by kernel and through the exact reference and
// scoring that use them; exp matches libm to a few ulp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/attention.h"
#include "engine/balance_walk.h"
#include "engine/protocol.h"
#include "engine/simd.h"

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
    for (int rows : {1, 9, 64})
      for (int cols : {1, 3, 8, 61}) {
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

// The packed layout engine/simd.h documents, written plainly.
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
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
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

}  // namespace
}  // namespace kvscope
