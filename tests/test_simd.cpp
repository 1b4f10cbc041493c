// The run-time dispatched SIMD kernels (engine/simd.h): every table this CPU runs agrees with the
// portable scalar one to 1e-9 relative, kernel by kernel and through the exact reference and
// scoring that use them; exp matches libm to a few ulp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/attention.h"
#include "engine/protocol.h"
#include "engine/simd.h"

namespace kvscope {
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
