#include "engine/methods/balancekv/balance_walk.h"

#include <Eigen/Eigenvalues>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/core/simd.h"
#include "engine/core/thread_pool.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"
#include "engine/ops/walk_blocks_cpu.h"

namespace kvscope {

// ---------------------------------------------------------------------------------------------
// Needle variant.

std::vector<int> protected_anticorrelated(const MatrixF& keys, int mid_begin, int mid_end,
                                          int block, int cap) {
  std::vector<int> out;
  if (cap <= 0 || mid_end <= mid_begin) return out;
  struct Flag {
    double score;
    int token;
  };
  std::vector<Flag> flagged;
  for (int b0 = mid_begin; b0 < mid_end; b0 += block) {
    const int b1 = std::min(mid_end, b0 + block);
    // mean_j <k_i, k_j> over the block (j = i included) is <k_i, mean of the block>.
    VectorD mean = keys.middleRows(b0, b1 - b0).cast<double>().colwise().mean().transpose();
    for (int i = b0; i < b1; ++i) {
      const double score = keys.row(i).cast<double>().dot(mean.transpose());
      if (score <= 0) flagged.push_back({score, i});
    }
  }
  std::stable_sort(flagged.begin(), flagged.end(),
                   [](const Flag& a, const Flag& b) { return a.score < b.score; });
  std::vector<char> taken(mid_end - mid_begin, 0);
  int count = 0;
  for (const Flag& f : flagged) {
    for (int off = 0; off <= kProtectDilation && count < cap; ++off) {
      for (int t : {f.token - off, f.token + off}) {
        if (t < mid_begin || t >= mid_end || taken[t - mid_begin] || count >= cap) continue;
        taken[t - mid_begin] = 1;
        ++count;
        if (off == 0) break;  // f.token - 0 == f.token + 0
      }
    }
    if (count >= cap) break;
  }
  for (int i = 0; i < mid_end - mid_begin; ++i)
    if (taken[i]) out.push_back(mid_begin + i);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Traces.

void fill_block_trace(WalkBlockTrace& t, const MatrixD& kernel, const MatrixD& query_terms,
                      uint64_t seed, uint32_t layer, uint32_t head, uint32_t round,
                      uint32_t block) {
  const int len = static_cast<int>(t.sigma.size());
  const int dv = static_cast<int>(query_terms.cols());
  t.disc_query.assign(len, 0);
  t.disc_kernel.assign(len, 0);
  t.random_disc_query.assign(len, 0);
  t.random_disc_kernel.assign(len, 0);
  t.path.assign(len, {0, 0});
  t.random_path.assign(len, {0, 0});
  if (len == 0) return;

  std::vector<int> rnd(len);
  for (int i = 0; i < len; ++i)
    rnd[i] = counter_uniform(seed, kRandRandomSigns, layer, head, round, block,
                             static_cast<uint32_t>(i)) < 0.5
                 ? +1
                 : -1;

  // Kernel-PCA coordinates. With H = I - 11^T/L and HKH alpha_a = lambda_a alpha_a (unit
  // alpha_a, so sum(alpha_a) = 0 for lambda_a > 0), the a-th principal direction in feature space
  // is u_a = sum_j alpha_aj (phi_j - mean phi) / sqrt(lambda_a). For one element,
  // <phi_l, u_a> = sum_j alpha_aj (K_lj - mean_m K_lm) / sqrt(lambda_a) = (K alpha_a)_l /
  // sqrt(lambda_a) because sum_j alpha_aj = 0. The prefix signed sum sum_{l<=i} sigma_l phi_l
  // therefore projects to sum_{l<=i} sigma_l (K alpha_a)_l / sqrt(lambda_a).
  MatrixD coord = MatrixD::Zero(len, 2);
  if (len >= 2) {
    Eigen::MatrixXd centred = kernel;
    const Eigen::VectorXd row_mean = centred.rowwise().mean();
    const Eigen::RowVectorXd col_mean = centred.colwise().mean();
    const double all_mean = centred.mean();
    centred.colwise() -= row_mean;
    centred.rowwise() -= col_mean;
    centred.array() += all_mean;
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(centred);
    if (eig.info() == Eigen::Success) {
      const double floor_eig = 1e-12 * std::max(1.0, std::abs(centred.trace()));
      for (int a = 0; a < 2; ++a) {
        const int idx = len - 1 - a;  // eigenvalues ascend
        const double lambda = eig.eigenvalues()(idx);
        if (idx < 0 || !(lambda > floor_eig)) continue;
        Eigen::VectorXd alpha = eig.eigenvectors().col(idx);
        Eigen::Index big = 0;
        alpha.cwiseAbs().maxCoeff(&big);
        if (alpha(big) < 0) alpha = -alpha;  // fix the eigenvector's sign for reproducible plots
        const Eigen::VectorXd c = kernel * alpha / std::sqrt(lambda);
        for (int l = 0; l < len; ++l) coord(l, a) = c(l);
      }
    }
  }

  Eigen::VectorXd acc = Eigen::VectorXd::Zero(dv), racc = Eigen::VectorXd::Zero(dv);
  double quad = 0, rquad = 0;
  std::array<double, 2> pth{0, 0}, rpth{0, 0};
  for (int i = 0; i < len; ++i) {
    double part = 0, rpart = 0;
    for (int j = 0; j < i; ++j) {
      part += kernel(i, j) * t.sigma[j];
      rpart += kernel(i, j) * rnd[j];
    }
    // sigma^T K sigma grows by 2 sigma_i sum_{j<i} K_ij sigma_j + K_ii.
    quad += 2.0 * t.sigma[i] * part + kernel(i, i);
    rquad += 2.0 * rnd[i] * rpart + kernel(i, i);
    t.disc_kernel[i] = std::sqrt(std::max(0.0, quad));
    t.random_disc_kernel[i] = std::sqrt(std::max(0.0, rquad));
    acc += t.sigma[i] * query_terms.row(i).transpose();
    racc += rnd[i] * query_terms.row(i).transpose();
    t.disc_query[i] = acc.norm();
    t.random_disc_query[i] = racc.norm();
    for (int a = 0; a < 2; ++a) {
      pth[a] += t.sigma[i] * coord(i, a);
      rpth[a] += rnd[i] * coord(i, a);
    }
    t.path[i] = pth;
    t.random_path[i] = rpth;
  }
}

std::vector<float> trace_query_vector(const MethodInput& in, int* position_out) {
  int pos = in.trace_query < 0 ? in.n - 1 : in.trace_query;
  if (pos < 0 || pos >= in.n) {
    std::ostringstream os;
    os << "trace query position " << in.trace_query << " is outside the capture's " << in.n
       << " tokens";
    throw InputError(os.str());
  }
  const MatrixF& src = in.queries.empty() || !in.queries[0] ? *in.keys : *in.queries[0];
  if (position_out) *position_out = pos;
  return std::vector<float>(src.row(pos).data(), src.row(pos).data() + src.cols());
}

namespace {

// sum[c] = the sum over the rows `tokens` (in order) of row[c], in double, as the block mean
// always summed them: the SIMD table's column_sums_f32 (engine/core/simd.h; AVX2, 32 columns per
// pass over the rows) where it has one, the same bits.
void column_sums(const float* rows, const int* tokens, int count, int d, double* sum) {
  if (const auto simd_sums = simd::kernels().column_sums_f32)
    return simd_sums(rows, tokens, count, d, sum);
  std::fill(sum, sum + d, 0.0);
  for (int i = 0; i < count; ++i) {
    const float* k = rows + static_cast<long>(tokens[i]) * d;
    for (int c = 0; c < d; ++c) sum[c] += k[c];
  }
}

// The walk's kernel for one block of prepared rows (centred keys, weighted values), full and
// symmetric, in double; used only for traces.
MatrixD block_kernel(const float* keys, const float* values, int len, int d, int dv,
                     const BalanceParams& prm) {
  const MatrixD kd = Eigen::Map<const MatrixF>(keys, len, d).cast<double>();
  const MatrixD vd = Eigen::Map<const MatrixF>(values, len, dv).cast<double>();
  const double scale = prm.temp / std::sqrt(static_cast<double>(d));
  MatrixD gk = kd * kd.transpose();
  MatrixD gv = vd * vd.transpose();
  return ((scale * gk.array() - prm.beta).exp() * (gv.array() + prm.value_bias)).matrix();
}

// The trace's query terms exp(<k_j,q>/sqrt d) w_j v_j for raw (uncentred) keys and the current
// accumulated weights, in units of the block's largest term so blocks are comparable (and
// nothing overflows): a single term has norm at most 1.
MatrixD query_terms(const WalkJob& job, const std::vector<int>& tokens, const double* weights,
                    int len) {
  const int d = static_cast<int>(job.keys->cols());
  const int dv = static_cast<int>(job.values->cols());
  Eigen::Map<const VectorF> q(job.trace_query.data(), d);
  std::vector<double> logit(len);
  double top = -INFINITY;
  for (int j = 0; j < len; ++j) {
    logit[j] = job.keys->row(tokens[j]).cast<double>().dot(q.cast<double>()) /
               std::sqrt(static_cast<double>(d));
    top = std::max(top, logit[j]);
  }
  MatrixD z(len, dv);
  double biggest = 0;
  for (int j = 0; j < len; ++j) {
    z.row(j) = std::exp(logit[j] - top) * weights[j] * job.values->row(tokens[j]).cast<double>();
    biggest = std::max(biggest, z.row(j).norm());
  }
  if (biggest > 0) z /= biggest;
  return z;
}

struct JobState {
  std::vector<int> seq;   // tokens still in play, walk order (ascending)
  std::vector<double> w;  // their accumulated weights
  std::vector<int> schedule;
  WalkOutcome out;
};

// The rows of one round, prepared for the walk op and read back after it: centred keys, weighted
// values, and per block its first row (offset), real rows, kv head and block id. One per thread,
// reused across rounds and calls.
struct RoundRows {
  std::vector<float> keys, values, p, partial;
  std::vector<int8_t> sigma;
  std::vector<int> offset, real_rows;
  std::vector<uint32_t> head, bid;
};

// One job's blocks of a round: where they are in RoundRows.
struct Span {
  size_t job;
  int first_block;  // index into offset/head/bid
  int num_blocks;
};

// Round 0's state of every job: all its tokens at weight 1 and its halving schedule.
std::vector<JobState> start_jobs(const std::vector<WalkJob>& jobs, const BalanceParams& prm) {
  std::vector<JobState> st(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const WalkJob& job = jobs[j];
    if (!job.keys || !job.values) throw std::invalid_argument("run_balance_walks: no keys/values");
    st[j].seq = job.tokens;
    st[j].w.assign(job.tokens.size(), 1.0);
    st[j].schedule = prm.kept == KeptCount::FloorHalving
                         ? floor_halving_schedule(static_cast<int>(job.tokens.size()), job.target)
                         : halving_schedule(static_cast<int>(job.tokens.size()), job.target);
    if (job.target <= 0) st[j].seq.clear(), st[j].w.clear();
  }
  return st;
}

// Sizes the round's buffers once: every row of the round is written (padding rows too), so they
// only grow and need no per-block zero fill. With `reuse_block_rows` every block is prepared into
// the same rows (the CPU walks each block as soon as it is prepared).
void size_round(RoundRows& r, const std::vector<WalkJob>& jobs, const std::vector<JobState>& st,
                int round, int block, bool padded, bool reuse_block_rows) {
  size_t key_floats = 0, value_floats = 0;
  long total_rows = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (round >= static_cast<int>(st[j].schedule.size())) continue;
    const long n = static_cast<long>(st[j].seq.size());
    const long rows = padded ? (n + block - 1) / block * block : n;
    total_rows += rows;
    const long held = reuse_block_rows ? std::min<long>(rows, block) : rows;
    if (reuse_block_rows) {
      key_floats = std::max(key_floats, static_cast<size_t>(held) * jobs[j].keys->cols());
      value_floats = std::max(value_floats, static_cast<size_t>(held) * jobs[j].values->cols());
    } else {
      key_floats += static_cast<size_t>(held) * jobs[j].keys->cols();
      value_floats += static_cast<size_t>(held) * jobs[j].values->cols();
    }
  }
  if (r.keys.size() < key_floats) r.keys.resize(key_floats);
  if (r.values.size() < value_floats) r.values.resize(value_floats);
  r.sigma.assign(total_rows, 0);
  r.p.assign(total_rows, 0);
  r.partial.assign(total_rows, 0);
}

// Centres the block [b0, b1) of a job's sequence into `kd` (rows x d) and weights its values into
// `vd` (rows x dv). centring = padded-block (the authors): the round is zero-padded to a multiple
// of B, the block mean is taken over all B rows (padding included), and the padding rows (key
// -mean, value 0) are walked after the real rows. They cannot change a real row's sign, except in
// float32, where an overflowing K_i,pad makes row i's sum NaN, as in the authors' code.
// centring = real-rows: the last block is shorter, mean over real rows.
void centre_block(const WalkJob& job, const JobState& s, int b0, int b1, int rows,
                  const BalanceParams& prm, float* kd0, float* vd0) {
  const int d = static_cast<int>(job.keys->cols()), dv = static_cast<int>(job.values->cols());
  const int real = b1 - b0;
  thread_local std::vector<double> mean;
  thread_local std::vector<float> mean_f;
  mean.resize(d);
  column_sums(job.keys->data(), s.seq.data() + b0, real, d, mean.data());
  for (double& m : mean) m /= rows;
  if (prm.float32) {
    // As torch: the float32 mean, subtracted in float32.
    mean_f.resize(d);
    for (int c = 0; c < d; ++c) mean_f[c] = static_cast<float>(mean[c]);
  }
  for (int i = b0; i < b0 + rows; ++i) {
    float* kd = kd0 + static_cast<size_t>(i - b0) * d;
    float* vd = vd0 + static_cast<size_t>(i - b0) * dv;
    if (i >= b1) {  // zero padding: centred key -mean, value 0
      for (int c = 0; c < d; ++c)
        kd[c] = prm.float32 ? 0.0f - mean_f[c] : static_cast<float>(-mean[c]);
      std::fill(vd, vd + dv, 0.0f);
      continue;
    }
    const long tok = s.seq[i];
    const float* k = job.keys->data() + tok * d;
    const float* v = job.values->data() + tok * dv;
    if (prm.float32)
      for (int c = 0; c < d; ++c) kd[c] = k[c] - mean_f[c];
    else
      for (int c = 0; c < d; ++c) kd[c] = static_cast<float>(k[c] - mean[c]);
    const double w = s.w[i];
    if (w == 1.0)  // every weight of round 1: v * 1 in double, back to float, is v
      std::copy(v, v + dv, vd);
    else
      for (int c = 0; c < dv; ++c) vd[c] = static_cast<float>(v[c] * w);
  }
}

// Walks one prepared block (the CPU path: while its rows are still in cache), prefetching the
// next block of the same job.
void walk_one_block(const WalkBatch& round_batch, const WalkJob& job, const JobState& s,
                    RoundRows& r, size_t kpos, size_t vpos, int rows, int blk, int b0, int block,
                    Backend* backend) {
  const int d = static_cast<int>(job.keys->cols()), dv = static_cast<int>(job.values->cols());
  const int n = static_cast<int>(s.seq.size());
  const int row0 = r.offset.back();
  const int one_offset[2] = {0, rows};
  const uint32_t one_head = static_cast<uint32_t>(job.kv_head);
  const uint32_t one_id = static_cast<uint32_t>(blk);
  WalkBatch one = round_batch;
  one.d = d;
  one.dv = dv;
  one.num_blocks = 1;
  one.keys = r.keys.data() + kpos;
  one.values = r.values.data() + vpos;
  one.block_offset = one_offset;
  one.block_head = &one_head;
  one.block_id = &one_id;
  one.sigma = r.sigma.data() + row0;
  one.p = r.p.data() + row0;
  one.partial = r.partial.data() + row0;
  // The next block of this job (the first block of the next job is not prefetched).
  walk_prefetch::NextRows next;
  next.keys = job.keys->data();
  next.values = job.values->data();
  next.d = d;
  next.dv = dv;
  next.tokens = s.seq.data() + std::min(n, b0 + block);
  next.count = std::min(n, b0 + 2 * block) - std::min(n, b0 + block);
  const walk_prefetch::Hint hint(&next);
  if (backend)
    backend->walk_blocks(one);
  else
    cpu_walk_blocks(one);
}

// Top-up after the last round when the schedule undershoots the target (ratios that are not
// powers of two): draw the missing tokens uniformly without replacement from this round's dropped
// tokens (all are prefix-majority tokens), keep them at their accumulated weight, and lower the
// prefix-minority factor from 2 to f = 2 - W_added / W_dropped so the prefix is still represented
// once: f = 2 when nothing is added, f = 1 when every dropped token comes back. Returns the
// positions added.
std::vector<int> top_up(const WalkJob& job, JobState& s, Halving& h, int keep, int round,
                        uint64_t seed, int layer) {
  const int n = static_cast<int>(s.seq.size());
  std::vector<int> dropped;  // every position the halving did not keep, in walk order
  std::vector<char> is_kept(n, 0);
  for (int pos : h.kept) is_kept[pos] = 1;
  for (int i = 0; i < n; ++i)
    if (!is_kept[i]) dropped.push_back(i);
  const int need = std::min<int>(job.target - keep, static_cast<int>(dropped.size()));
  for (int i = 0; i < need; ++i) {
    const double u = counter_uniform(seed, kRandTopUp, static_cast<uint32_t>(layer),
                                     static_cast<uint32_t>(job.kv_head),
                                     static_cast<uint32_t>(round), 0, static_cast<uint32_t>(i));
    const int rem = static_cast<int>(dropped.size()) - i;
    const int pick = i + std::min(rem - 1, static_cast<int>(u * rem));
    std::swap(dropped[i], dropped[pick]);
  }
  std::vector<int> added(dropped.begin(), dropped.begin() + need);
  double w_dropped = 0, w_added = 0;
  for (int pos : dropped) w_dropped += s.w[pos];
  for (int pos : added) w_added += s.w[pos];
  const double f = w_dropped > 0 ? 2.0 - w_added / w_dropped : 2.0;
  for (size_t k = 0; k < h.kept.size(); ++k)
    if (h.factor[k] == 2.0) h.factor[k] = f;
  s.out.topped_up = need;
  return added;
}

// Records the round's blocks of one job for the Walk view, before the sequence is replaced.
void trace_round(const WalkJob& job, JobState& s, const Span& sp, const RoundRows& r,
                 const Halving& h, const std::vector<int>& added, int round, int block,
                 uint64_t seed, int layer, const BalanceParams& prm) {
  const int d = static_cast<int>(job.keys->cols()), dv = static_cast<int>(job.values->cols());
  const int n = static_cast<int>(s.seq.size());
  std::vector<int> kept_flag(n, 0);
  for (int pos : h.kept) kept_flag[pos] = 1;
  for (int pos : added) kept_flag[pos] = 2;
  for (int b = 0; b < sp.num_blocks; ++b) {
    const int gb = sp.first_block + b;
    const int r0 = r.offset[gb], len = r.real_rows[gb], r1 = r0 + len, start = b * block;
    WalkBlockTrace t;
    t.round = round;
    t.block = b;
    t.block_start = start;
    t.round_cut = h.cut;
    t.halving_cut = h.cut >= start && h.cut < start + len ? h.cut - start : -1;
    t.tokens.assign(s.seq.begin() + start, s.seq.begin() + start + len);
    t.p.assign(r.p.begin() + r0, r.p.begin() + r1);
    t.partial.assign(r.partial.begin() + r0, r.partial.begin() + r1);
    t.sigma.assign(r.sigma.begin() + r0, r.sigma.begin() + r1);
    t.kept.assign(kept_flag.begin() + start, kept_flag.begin() + start + len);
    int sat = 0;
    for (int i = 1; i < len; ++i)
      if (!(t.p[i] > 0.0 && t.p[i] < 1.0)) ++sat;
    t.saturation = len > 1 ? static_cast<double>(sat) / (len - 1) : 0.0;
    const MatrixD kern =
        block_kernel(r.keys.data() + static_cast<long>(r0) * d,
                     r.values.data() + static_cast<long>(r0) * dv, len, d, dv, prm);
    const MatrixD qt = query_terms(job, t.tokens, s.w.data() + start, len);
    fill_block_trace(t, kern, qt, seed, static_cast<uint32_t>(layer),
                     static_cast<uint32_t>(job.kv_head), static_cast<uint32_t>(round),
                     static_cast<uint32_t>(b));
    s.out.trace_blocks.push_back(std::move(t));
  }
}

// The next round's tokens: those the halving kept (weights times their factor) and those the
// top-up added (at their weight), in walk order.
void advance(JobState& s, const Halving& h, const std::vector<int>& added, int round) {
  std::vector<std::pair<int, double>> next;  // (position, factor)
  next.reserve(h.kept.size() + added.size());
  for (size_t k = 0; k < h.kept.size(); ++k) next.push_back({h.kept[k], h.factor[k]});
  for (int pos : added) next.push_back({pos, 1.0});
  if (!added.empty()) std::sort(next.begin(), next.end());  // h.kept is already ascending
  std::vector<int> seq;
  std::vector<double> w;
  seq.reserve(next.size());
  w.reserve(next.size());
  for (auto [pos, f] : next) {
    seq.push_back(s.seq[pos]);
    w.push_back(s.w[pos] * f);
  }
  s.seq = std::move(seq);
  s.w = std::move(w);
  s.out.rounds = round + 1;
}

// After the walk op: one job's signs in walk order (padding rows dropped) and its saturation,
// the halving, the top-up of the last round, the trace, and the next round's tokens.
void finish_round(const WalkJob& job, JobState& s, const Span& sp, const RoundRows& r, int round,
                  int block, uint64_t seed, int layer, const BalanceParams& prm) {
  std::vector<int8_t> sg;
  sg.reserve(s.seq.size());
  for (int b = 0; b < sp.num_blocks; ++b) {
    const int gb = sp.first_block + b;
    const int r0 = r.offset[gb];
    sg.insert(sg.end(), r.sigma.begin() + r0, r.sigma.begin() + r0 + r.real_rows[gb]);
    for (int i = 1; i < r.real_rows[gb]; ++i)
      if (!(r.p[r0 + i] > 0.0f && r.p[r0 + i] < 1.0f)) ++s.out.saturated_steps;
    s.out.walked_steps += std::max(0, r.real_rows[gb] - 1);
  }
  const bool last = round + 1 == static_cast<int>(s.schedule.size());
  const int keep = s.schedule[round];
  Halving h =
      prm.halving == HalvingRule::Authors ? authors_halving(sg, keep) : exact_halving(sg, keep);
  std::vector<int> added;
  if (last && keep < job.target && job.top_up) added = top_up(job, s, h, keep, round, seed, layer);
  if (!job.trace_query.empty())
    trace_round(job, s, sp, r, h, added, round, block, seed, layer, prm);
  advance(s, h, added, round);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rounds.

WalkBatch walk_batch_of(const BalanceParams& prm, uint64_t seed, int layer, int round) {
  WalkBatch batch;
  batch.seed = seed;
  batch.layer = static_cast<uint32_t>(layer);
  batch.round = static_cast<uint32_t>(round);
  batch.gamma = prm.gamma;
  batch.temp = prm.temp;
  batch.beta = prm.beta;
  batch.value_bias = prm.value_bias;
  batch.float32 = prm.float32;
  batch.value_eps = prm.float32 ? kAuthorsValueEps : 0.0;
  return batch;
}

std::vector<WalkOutcome> run_balance_walks(const std::vector<WalkJob>& jobs, int layer,
                                           uint64_t seed, const BalanceParams& prm,
                                           Backend* backend) {
  std::vector<JobState> st = start_jobs(jobs, prm);
  const int block = std::max(2, prm.block);
  const bool padded = prm.centring == Centring::PaddedBlock;
  thread_local RoundRows r;

  for (int round = 0;; ++round) {
    std::vector<Span> spans;
    r.offset.assign(1, 0), r.head.clear(), r.bid.clear();
    r.real_rows.clear();
    int d = -1, dv = -1;
    // On the CPU each block is walked as soon as it is prepared, while its rows are still in
    // cache (the results do not depend on which blocks share a call); a GPU gets the whole round
    // in one call. Without traces (which read the round's prepared rows afterwards) the CPU
    // prepares every block into the same rows, which stay in cache.
    const bool walk_each_block = !backend || !backend->parallel_in_one_call();
    bool any_trace = false;
    for (size_t j = 0; j < jobs.size(); ++j)
      if (round < static_cast<int>(st[j].schedule.size()) && !jobs[j].trace_query.empty())
        any_trace = true;
    const bool reuse_block_rows = walk_each_block && !any_trace;
    size_round(r, jobs, st, round, block, padded, reuse_block_rows);
    size_t kpos = 0, vpos = 0;
    WalkBatch batch = walk_batch_of(prm, seed, layer, round);
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (round >= static_cast<int>(st[j].schedule.size())) continue;
      const WalkJob& job = jobs[j];
      const int jd = static_cast<int>(job.keys->cols()), jdv = static_cast<int>(job.values->cols());
      if (d < 0) d = jd, dv = jdv;
      if (jd != d || jdv != dv)
        throw std::invalid_argument("run_balance_walks: jobs with different head dimensions");
      const int n = static_cast<int>(st[j].seq.size());
      Span sp{j, static_cast<int>(r.head.size()), 0};
      for (int b0 = 0, blk = 0; b0 < n; b0 += block, ++blk) {
        const int b1 = std::min(n, b0 + block);
        const int rows = padded ? block : b1 - b0;
        centre_block(job, st[j], b0, b1, rows, prm, r.keys.data() + kpos, r.values.data() + vpos);
        if (walk_each_block)
          walk_one_block(batch, job, st[j], r, kpos, vpos, rows, blk, b0, block, backend);
        if (!reuse_block_rows) {
          kpos += static_cast<size_t>(rows) * d;
          vpos += static_cast<size_t>(rows) * dv;
        }
        r.offset.push_back(r.offset.back() + rows);
        r.real_rows.push_back(b1 - b0);
        r.head.push_back(static_cast<uint32_t>(job.kv_head));
        r.bid.push_back(static_cast<uint32_t>(blk));
        ++sp.num_blocks;
      }
      spans.push_back(sp);
    }
    if (spans.empty()) break;

    if (!walk_each_block) {
      batch.d = d;
      batch.dv = dv;
      batch.num_blocks = static_cast<int>(r.head.size());
      batch.keys = r.keys.data();
      batch.values = r.values.data();
      batch.block_offset = r.offset.data();
      batch.block_head = r.head.data();
      batch.block_id = r.bid.data();
      batch.sigma = r.sigma.data();
      batch.p = r.p.data();
      batch.partial = r.partial.data();
      backend->walk_blocks(batch);
    }
    for (const Span& sp : spans)
      finish_round(jobs[sp.job], st[sp.job], sp, r, round, block, seed, layer, prm);
  }

  // Keep the reusable buffers for the next call (live slider moves on one head), but do not let
  // one layer-sized call pin hundreds of MB on this thread.
  if (r.keys.capacity() + r.values.capacity() > (size_t{32} << 20)) {
    std::vector<float>().swap(r.keys);
    std::vector<float>().swap(r.values);
    std::vector<float>().swap(r.p);
    std::vector<float>().swap(r.partial);
    std::vector<int8_t>().swap(r.sigma);
    std::vector<int>().swap(r.real_rows);
  }

  std::vector<WalkOutcome> out(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    out[j] = std::move(st[j].out);
    out[j].indices = std::move(st[j].seq);
    out[j].weights = std::move(st[j].w);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The method for one head, and the whole layer.

namespace {

struct HeadPlan {
  bool trivial = false;  // nothing to walk: `result` is final
  Selection result;
  std::vector<int> protected_tokens;
  bool protect_capped = false;
  WalkJob job;
  int trace_position = -1;
  int budget = 0;
};

HeadPlan plan_head(const MethodInput& in, const BalanceParams& prm) {
  check_method_input(in, "balancekv", false);
  HeadPlan plan;
  const int n_mid = in.mid_end - in.mid_begin;
  const int m = in.budget;
  if (m == 0 || m >= n_mid) {
    plan.trivial = true;
    if (m > 0) {
      for (int t = in.mid_begin; t < in.mid_end; ++t) {
        plan.result.indices.push_back(t);
        plan.result.weights.push_back(1.0);
      }
      plan.result.note = "budget covers the whole middle: nothing to compress";
    } else {
      plan.result.note = "budget 0: nothing kept from the middle";
    }
    return plan;
  }
  if (prm.protect_anticorrelated) {
    plan.protected_tokens =
        protected_anticorrelated(*in.keys, in.mid_begin, in.mid_end, prm.block, m / 2);
    plan.protect_capped = static_cast<int>(plan.protected_tokens.size()) == m / 2;
  }
  plan.job.keys = in.keys;
  plan.job.values = in.values;
  plan.job.kv_head = in.kv_head;
  plan.job.target = m - static_cast<int>(plan.protected_tokens.size());
  // kept = floor-halving keeps what log2(1/ratio) floor halvings leave (at most the budget); only
  // a ratio that is not a power of two is topped up to the budget after ceil(log2(1/ratio)) rounds.
  const double rounds = std::log2(1.0 / in.keep_ratio);
  const bool power_of_two = in.keep_ratio > 0 && std::abs(rounds - std::round(rounds)) < 1e-9;
  plan.job.top_up = prm.kept == KeptCount::Budget || !power_of_two;
  plan.budget = m;
  size_t k = 0;
  for (int t = in.mid_begin; t < in.mid_end; ++t) {
    if (k < plan.protected_tokens.size() && plan.protected_tokens[k] == t) {
      ++k;
      continue;
    }
    plan.job.tokens.push_back(t);
  }
  if (in.want_trace) plan.job.trace_query = trace_query_vector(in, &plan.trace_position);
  return plan;
}

Selection finish_head(HeadPlan& plan, WalkOutcome& out, const MethodInput& in) {
  Selection sel;
  std::vector<std::pair<int, double>> all;
  for (int t : plan.protected_tokens) all.push_back({t, 1.0});
  for (size_t i = 0; i < out.indices.size(); ++i) all.push_back({out.indices[i], out.weights[i]});
  std::sort(all.begin(), all.end());
  for (auto [t, w] : all) {
    sel.indices.push_back(t);
    sel.weights.push_back(w);
  }
  std::ostringstream note;
  const int kept = static_cast<int>(sel.indices.size());
  const double saturation =
      out.walked_steps > 0 ? static_cast<double>(out.saturated_steps) / out.walked_steps : 0.0;
  note << "kept " << kept << " of budget " << plan.budget << "; " << out.rounds << " halving round"
       << (out.rounds == 1 ? "" : "s") << " over " << plan.job.tokens.size() << " tokens; "
       << std::lround(100.0 * saturation) << "% of steps saturated (p clipped to 0 "
       << "or 1)";
  if (saturation >= 0.9)
    note << ": the walk is nearly deterministic (p is forced, not drawn); temp and gamma set "
            "how hard the kernel pushes";
  if (out.topped_up > 0)
    note << "; keep ratio is not a power of two: topped up " << out.topped_up
         << " tokens uniformly from the last round's dropped tokens (their partners' weight "
            "lowered from 2 so the prefix stays represented once)";
  if (!plan.protected_tokens.empty())
    note << "; " << plan.protected_tokens.size()
         << " anti-correlated keys protected at weight 1 outside the walk"
         << (plan.protect_capped ? " (capped at half the budget)" : "");
  sel.note = note.str();
  sel.saturation = saturation;
  if (in.want_trace) {
    auto tr = std::make_shared<WalkTrace>();
    tr->rounds = out.rounds;
    tr->saturation = saturation;
    tr->saturated_steps = out.saturated_steps;
    tr->walked_steps = out.walked_steps;
    tr->kept = kept;
    tr->budget = plan.budget;
    tr->trace_query = plan.trace_position;
    tr->blocks = std::move(out.trace_blocks);
    tr->note = sel.note;
    sel.trace = std::move(tr);
  }
  return sel;
}

}  // namespace

Selection balancekv_select(const MethodInput& in) {
  const BalanceParams prm = balance_params_from(in.params);
  HeadPlan plan = plan_head(in, prm);
  if (plan.trivial) return plan.result;
  std::vector<WalkOutcome> out = run_balance_walks({plan.job}, in.layer, in.seed, prm, in.backend);
  return finish_head(plan, out[0], in);
}

std::vector<Selection> balancekv_layer(const LayerData& layer, int num_layers, const EvalWindow& w,
                                       uint64_t seed, const ParamValues& params, Backend& backend,
                                       bool want_trace, int trace_query) {
  const BalanceParams prm = balance_params_from(params);
  const int heads = static_cast<int>(layer.keys.size());
  std::vector<Selection> result(heads);
  std::vector<MethodInput> inputs(heads);
  std::vector<HeadPlan> plans(heads);
  std::vector<WalkJob> jobs;
  std::vector<int> job_head;
  for (int h = 0; h < heads; ++h) {
    if (h < static_cast<int>(layer.refused.size()) && !layer.refused[h].empty()) {
      result[h].note = "head refused: " + layer.refused[h];
      continue;
    }
    MethodInput& in = inputs[h];
    in = make_method_input(layer, num_layers, h, w, params, seed);
    in.want_trace = want_trace;
    in.trace_query = trace_query;
    in.backend = &backend;
    plans[h] = plan_head(in, prm);
    if (plans[h].trivial) {
      result[h] = plans[h].result;
      continue;
    }
    jobs.push_back(plans[h].job);
    job_head.push_back(h);
  }
  std::vector<WalkOutcome> out;
  const int threads = std::min(hardware_threads(), static_cast<int>(jobs.size()));
  if (backend.parallel_in_one_call() || threads <= 1) {
    // One walk_blocks call per round for all heads: the GPU kernel parallelises over them.
    out = run_balance_walks(jobs, layer.layer, seed, prm, &backend);
  } else {
    // The CPU op is sequential; spread the heads over the cores instead, thread t taking heads
    // t, t + threads, ... in one call. The result is the same: the walk's random numbers do not
    // depend on which heads share a call.
    out.resize(jobs.size());
    parallel_for(threads, threads, nullptr, [&](int t) {
      std::vector<WalkJob> mine;
      std::vector<size_t> where;
      for (size_t j = static_cast<size_t>(t); j < jobs.size(); j += threads) {
        mine.push_back(jobs[j]);
        where.push_back(j);
      }
      std::vector<WalkOutcome> got = run_balance_walks(mine, layer.layer, seed, prm, &backend);
      for (size_t k = 0; k < got.size(); ++k) out[where[k]] = std::move(got[k]);
    });
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    const int h = job_head[j];
    result[h] = finish_head(plans[h], out[j], inputs[h]);
  }
  return result;
}

}  // namespace kvscope
