#include "engine/eval/token_harm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/core/error.h"
#include "engine/core/simd.h"
#include "engine/eval/reference_cache.h"
#include "engine/io/capture.h"

namespace kvscope {

namespace {
constexpr double kMinusInf = -std::numeric_limits<double>::infinity();

std::string shape(const MatrixF& m) {
  return std::to_string(m.rows()) + "x" + std::to_string(m.cols());
}
}  // namespace

std::vector<const MatrixF*> harm_queries(const LayerData& layer, int kv) {
  return reference_queries(layer, kv);  // the protocol's rule, written once
}

TokenHarm token_harm(const std::vector<const MatrixF*>& queries, const MatrixF& K, const MatrixF& V,
                     int sink, int eval, const std::atomic<bool>* cancel) {
  const int n = static_cast<int>(K.rows()), d = static_cast<int>(K.cols()),
            dv = static_cast<int>(V.cols());
  if (n <= 0 || sink < 0 || eval <= 0 || sink + eval > n)
    throw std::invalid_argument("token harm: bad window n=" + std::to_string(n) +
                                " s=" + std::to_string(sink) + " E=" + std::to_string(eval));
  if (d <= 0 || dv <= 0) throw std::invalid_argument("token harm: empty key or value rows");
  if (V.rows() != K.rows())
    throw std::invalid_argument("token harm: keys are " + shape(K) + ", values " + shape(V));
  if (queries.empty()) throw std::invalid_argument("token harm: no queries");
  for (const MatrixF* q : queries)
    if (!q || q->rows() != K.rows() || q->cols() != K.cols())
      throw std::invalid_argument("token harm: queries are " + (q ? shape(*q) : "null") +
                                  ", keys " + shape(K));

  const simd::Kernels& kern = simd::kernels();
  const MatrixD Kd = K.cast<double>(), Vd = V.cast<double>();
  const int mid_end = n - eval, M = mid_end - sink, first = n - eval;
  std::vector<double> v_sq(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) v_sq[static_cast<size_t>(j)] = Vd.row(j).squaredNorm();

  TokenHarm out;
  out.sink = sink;
  out.eval = eval;
  out.harm.assign(static_cast<size_t>(M), 0.0);
  out.mass.assign(static_cast<size_t>(n), 0.0);

  // Query rows per panel: the two keys x rows work panels stay near 16 MiB each at any n.
  const int R = std::clamp((1 << 21) / n, 1, 64);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  MatrixD Qp, P, O, OVt;
  Eigen::RowVectorXd
      o_rest;  // P: keys x rows, exp(l - max) (0 past each query); OVt: middle x rows
  std::vector<double> shift, z, o_sq, o_norm;
  for (const MatrixF* qm : queries) {
    for (int r0 = 0; r0 < eval; r0 += R) {
      if (cancel && cancel->load(std::memory_order_relaxed)) throw Cancelled();
      const int rows = std::min(R, eval - r0);
      const int keys = first + r0 + rows;  // the panel's last query sees keys [0, keys)
      Qp = qm->block(first + r0, 0, rows, d).cast<double>();
      P.resize(keys, rows);
      kern.gemm_abt(keys, rows, d, scale, Kd.data(), d, Qp.data(), d, P.data(), rows);
      for (int i = first + r0 + 1; i < keys; ++i)  // causal mask: query e sees keys <= first+r0+e
        for (int e = 0; e < i - first - r0; ++e) P(i, e) = kMinusInf;
      shift.assign(static_cast<size_t>(rows), kMinusInf);
      kern.col_max(P.data(), keys, rows, rows, shift.data());
      kern.col_exp_sub(P.data(), keys, rows, rows, shift.data());
      z.assign(static_cast<size_t>(rows), 0.0);
      kern.col_sums(P.data(), keys, rows, rows, nullptr, z.data(), nullptr);
      O.setZero(rows, dv);
      kern.gemm_atb_acc(rows, dv, keys, P.data(), rows, Vd.data(), dv, nullptr, O.data(), dv);
      o_sq.resize(static_cast<size_t>(rows));
      o_norm.resize(static_cast<size_t>(rows));
      for (int e = 0; e < rows; ++e) {
        O.row(e) /= z[static_cast<size_t>(e)];
        o_sq[static_cast<size_t>(e)] = O.row(e).squaredNorm();
        o_norm[static_cast<size_t>(e)] = std::sqrt(o_sq[static_cast<size_t>(e)]);
      }
      for (int j = 0; j < keys; ++j)
        for (int e = 0; e < rows; ++e)
          out.mass[static_cast<size_t>(j)] += P(j, e) / z[static_cast<size_t>(e)];
      if (M <= 0) continue;
      // <v_j, o_e> of every middle key: ||o - v||^2 = ||o||^2 - 2 <o, v> + ||v||^2.
      OVt.resize(M, rows);
      kern.gemm_abt(M, rows, dv, 1.0, Vd.data() + static_cast<size_t>(sink) * dv, dv, O.data(), dv,
                    OVt.data(), rows);
      for (int j = sink; j < mid_end; ++j) {
        double acc = 0;
        for (int e = 0; e < rows; ++e) {
          const double pj = P(j, e), zz = z[static_cast<size_t>(e)];
          if (pj == 0) continue;
          const double on = o_norm[static_cast<size_t>(e)];
          const double rest = zz - pj;  // sum of the others, in the same shifted scale
          double change;                // ||o_i' - o_i||
          if (rest < 0.5 * zz) {
            // p_ij > 1/2 (one token per query at most): z - P and o_i - v_j both cancel. With
            // o_i = p v_j + (1 - p) o_i', the change is p ||o_i' - v_j||, o_i' summed directly.
            double others = 0;
            o_rest.setZero(dv);
            for (int k = 0; k < keys; ++k)
              if (k != j && P(k, e) != 0) {
                others += P(k, e);
                o_rest += P(k, e) * Vd.row(k);
              }
            if (others == 0) {
              change = std::numeric_limits<double>::infinity();  // nothing left to attend to
            } else {
              o_rest /= others;
              change = pj / zz * (o_rest - Vd.row(j)).norm();
            }
          } else {
            const double vs = v_sq[static_cast<size_t>(j)], os = o_sq[static_cast<size_t>(e)];
            double dist_sq = os - 2 * OVt(j - sink, e) + vs;
            if (dist_sq < 1e-6 * (os + vs))  // o_i close to v_j: the expansion cancels
              dist_sq = (O.row(e) - Vd.row(j)).squaredNorm();
            change = pj / rest * std::sqrt(std::max(dist_sq, 0.0));  // p / (1 - p) ||o_i - v_j||
          }
          acc += on > 0 ? change / on : change;
        }
        out.harm[static_cast<size_t>(j - sink)] += acc;
      }
    }
  }
  const double inv = 1.0 / (static_cast<double>(queries.size()) * eval);
  for (double& h : out.harm) h *= inv;
  for (double& m : out.mass) m *= inv;
  return out;
}

HarmSplit harm_split(const TokenHarm& harm, const Selection& sel) {
  const int M = static_cast<int>(harm.harm.size());
  std::vector<char> kept(static_cast<size_t>(M), 0);
  auto mark = [&](const std::vector<int>& idx) {
    for (int i : idx) {
      const int t = i - harm.sink;
      if (t < 0 || t >= M)
        throw std::out_of_range("token harm: selection index " + std::to_string(i) +
                                " is outside the middle [" + std::to_string(harm.sink) + ", " +
                                std::to_string(harm.sink + M) + ")");
      kept[static_cast<size_t>(t)] = 1;
    }
  };
  mark(sel.indices);
  if (sel.separate) mark(sel.den_indices);
  HarmSplit s;
  for (int t = 0; t < M; ++t) {
    const double h = harm.harm[static_cast<size_t>(t)];
    if (kept[static_cast<size_t>(t)]) {
      ++s.kept_count;
      s.kept_sum += h;
    } else {
      ++s.dropped_count;
      s.dropped_sum += h;
    }
  }
  s.kept_mean = s.kept_count ? s.kept_sum / s.kept_count : 0;
  s.dropped_mean = s.dropped_count ? s.dropped_sum / s.dropped_count : 0;
  s.total = s.kept_sum + s.dropped_sum;
  return s;
}

}  // namespace kvscope
