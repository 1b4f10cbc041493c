// Weighted-attention error on the GPU (docs/evaluation.md "The metrics"; ErrorBatch and the CPU
// reference cpu_attention_errors in engine/ops/attention_errors.h): for
// every evaluation query j in [n-E, n) of every query head of one layer, the exact output
// Attn_j over keys [0, j], the estimator z_j over sinks + selection + window [n-E, j] (separate
// numerator and denominator sets, log weights as logit biases), and the three figures
// cpu_attention_errors reports: relative error, the paper's normalised error, kept mass.
//
// Two kernels: the exact side of every evaluation query (kept on the device
// for a named layer, so later calls skip it), then the approximate side over the candidates only
// (sinks, selections, window, gathered by index) against it. Each: one thread block per (query
// head, tile of kErrQueries consecutive evaluation queries); keys and values stream through
// shared memory in tiles of kErrKeys; each query keeps running log-sum-exp states (the exact
// one, or the numerator's and denominator's: flash-attention style online rescaling), so there
// is no limit on n and nothing overflows. Logits and per-tile sums are double (float with
// ErrorBatch::float_scores); everything carried across tiles (output vectors, normalisers,
// masses) is double.
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::attention_errors (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/ops/backend.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_backend.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/resident_layers.cuh"

namespace kvscope::cuda {

constexpr int kErrQueries = 16;  // evaluation queries per thread block
constexpr int kErrKeys = 32;     // keys per shared-memory tile (one per lane)
constexpr int kErrThreads = 256;
constexpr int kErrMaxDv = 256;  // value dims the register accumulators are sized for

struct ErrorDeviceArgs {
  int n = 0, d = 0, dv = 0, q_heads = 0, kv_heads = 0, sink = 0, eval = 0;
  bool float_scores = false;  // see ErrorBatch::float_scores
  // Device pointer tables: each head's rows, in the call's workspace or resident
  // (kernels/resident_layers.cuh).
  const float* const* keys = nullptr;     // [kv_heads] -> n x d
  const float* const* values = nullptr;   // [kv_heads] -> n x dv
  const float* const* queries = nullptr;  // [q_heads] -> eval x d: only the evaluation rows
  // The approximate side's candidates per kv head, ascending tokens: the sinks, the middle's
  // tokens either selection holds, the window ([kv_heads][cand_stride], cand_count[kv] used),
  // with their numerator and denominator log weights (-inf where that set does not hold them).
  const int* cand = nullptr;
  const int* cand_count = nullptr;  // [kv_heads]
  const double* cand_lwn = nullptr;
  const double* cand_lwd = nullptr;
  int cand_stride = 0;
  // [q_heads] -> [eval][dv + 3] doubles: Attn_j, then its maximum logit, normaliser and sum of
  // squared weights. Written by the exact-side kernel when compute_exact, else kept from an
  // earlier call (kernels/resident_layers.cuh).
  double* const* exact = nullptr;
  bool compute_exact = true;
  double* v_sq_prefix = nullptr;  // [kv_heads][eval]: sum_{i<=j} ||v_i||^2 (filled on device)
  double* relative = nullptr;     // [q_heads][eval]
  double* normalized = nullptr;
  double* mass = nullptr;
};

// Device copies of one ErrorBatch, reused across calls.
struct ErrorWorkspace final : OpWorkspace {
  DeviceBuffer keys, values, queries, lw_num, lw_den, cand, v_sq, out, tables, exact, exact_tables;
  void release() override {
    tables.release();
    cand.release();
    exact.release();
    exact_tables.release();
    keys.release();
    values.release();
    queries.release();
    lw_num.release();
    lw_den.release();
    v_sq.release();
    out.release();
  }
};

class ResidentLayers;

// Checks `b` exactly as cpu_attention_errors does (same exception types and messages), uploads
// it into `ws` and returns the device view. Selections become dense per-token log-weight rows.
// With `resident` and a non-zero b.layer_id, keys, values and the evaluation query rows come
// from (or go once into) the resident layer copies instead of being uploaded again.
ErrorDeviceArgs upload_error_batch(const ErrorBatch& b, ErrorWorkspace& ws,
                                   ResidentLayers* resident, cudaStream_t stream);

// Dynamic shared memory the main kernel needs for these shapes, or 0 when they are beyond what
// this kernel supports (dv > kErrMaxDv, or more shared memory than the device allows).
size_t attention_error_smem_bytes(int d, int dv, int device_smem_optin, bool float_scores);

// Enqueues the kernels; throws CudaFailure when a launch is rejected.
void launch_attention_errors(const ErrorDeviceArgs& a, int device_smem_optin, cudaStream_t stream);

// Copies the outputs back into the batch's (non-null) output arrays.
void download_error_outputs(const ErrorDeviceArgs& a, const ErrorBatch& b, cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

constexpr int kWarps = kErrThreads / 32;
static_assert(kErrKeys == 32, "the bookkeeping phase maps one key to one lane");
static_assert(kErrQueries * kErrKeys == 2 * kErrThreads, "the logit phase: two queries per thread");
static_assert(kErrQueries % 4 == 0, "float4 reads of a key's query weights");

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_max(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float exp_of(float x) {
  return expf(x);
}
__device__ __forceinline__ double exp_of(double x) {
  return exp(x);
}
// exp(old - now) for a running max that moved from `old` to `now` (0 when nothing was there).
template <typename Real>
__device__ __forceinline__ Real rescale(Real old, Real now) {
  return old == -INFINITY ? Real(0) : exp_of(old - now);
}

// sum_{i<=j} ||v_i||^2 for each evaluation position j, per kv head, in double. One block per kv
// head: a tree reduction over [0, n-E), then a sequential scan over the window (E is small).
__global__ void v_sq_prefix_kernel(ErrorDeviceArgs a) {
  const int kvh = blockIdx.x;
  const float* v = a.values[kvh];
  const int win = a.n - a.eval;
  __shared__ double partial[kErrThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < win; i += blockDim.x)
    for (int c = 0; c < a.dv; ++c) {
      const double x = v[static_cast<size_t>(i) * a.dv + c];
      s += x * x;
    }
  double* out = a.v_sq_prefix + static_cast<size_t>(kvh) * a.eval;
  for (int e = threadIdx.x; e < a.eval; e += blockDim.x) {
    double r = 0.0;
    for (int c = 0; c < a.dv; ++c) {
      const double x = v[static_cast<size_t>(win + e) * a.dv + c];
      r += x * x;
    }
    out[e] = r;
  }
  // The reduction's first barrier also orders the window's squares (out) before thread 0 reads.
  const double total = block_reduce(s, false, partial);
  if (threadIdx.x == 0) {
    double acc = total;
    for (int e = 0; e < a.eval; ++e) {
      acc += out[e];
      out[e] = acc;
    }
  }
}

// Shared memory layout of the main kernel (byte offsets, each region 16-byte aligned).
// Key rows are padded to kpitch floats: d + 4 when d % 4 == 0 (rows stay 16-byte aligned for
// float4 reads, and the +4 spreads a warp's rows over all banks), else d + 1 (scalar reads).
// The tile's weights are stored transposed, [key][query], so a thread reads the weights of its
// consecutive queries for one key as float4s. `real` is the size of the scores' type (float or
// double, see attention_error_kernel); keys and values stay float.
struct ErrSmem {
  size_t state_d, state_f, q, s, px, pn, k, v, total;
  int kpitch;
  bool vec;
  __host__ __device__ static size_t up16(size_t x) { return (x + 15) / 16 * 16; }
  __host__ __device__ ErrSmem(int d, int dv, size_t real) {
    vec = d % 4 == 0;
    kpitch = vec ? d + 4 : d + 1;
    state_d = 0;                                                 // 4 x kErrQueries doubles
    state_f = up16(state_d + 4 * kErrQueries * sizeof(double));  // 5 x kErrQueries reals
    q = up16(state_f + 5 * kErrQueries * real);                  // kErrQueries x d
    s = up16(q + static_cast<size_t>(kErrQueries) * d * real);
    px = s + kErrQueries * kErrKeys * real;
    pn = px + kErrQueries * kErrKeys * real;
    k = up16(pn + kErrQueries * kErrKeys * real);  // kErrKeys x kpitch
    v = up16(k + static_cast<size_t>(kErrKeys) * kpitch * sizeof(float));
    const size_t tiles_end = v + static_cast<size_t>(kErrKeys) * dv * sizeof(float);
    // The final reduction reuses the tile region for 2 x kErrQueries x dv doubles.
    const size_t final_end = k + 2 * static_cast<size_t>(kErrQueries) * dv * sizeof(double);
    total = tiles_end > final_end ? tiles_end : final_end;
  }
};

// The errors run as two kernels, the exact side kept on the device:
//   kExactSide: the exact attention of every evaluation query j over keys [0, j]: its output
//     vector Attn_j, its largest logit mx_j, sx_j = sum_i exp(l_ji - mx_j) and
//     sq_j = sum_i exp(l_ji - mx_j)^2, written to its query head's exact table
//     ([eval][dv + 3] doubles: the vector, then mx, sx, sq). It does not depend on the selection,
//     so for a named layer (ErrorBatch::layer_id) the backend keeps the tables resident per
//     (layer, query head, window) and runs this kernel only for new data.
//   kApproxSide: the estimator z_j over the candidates only (the sinks, the union of the
//     numerator and denominator selections and the window, gathered by index), the kept mass
//     against the stored mx_j and sx_j, and the three figures against the stored exact side.
// Every call takes the same two steps (the exact tables made in this call or kept), so the
// figures do not depend on what was resident.
// Real: the type of the logits, the per-tile weights and sums and the running maxima. double
// (the default) reproduces the CPU reference to rounding (its figures agree to about 1e-12);
// float (ErrorBatch::float_scores) is faster, and its figures differ from the CPU's by about 1e-6
// relative (more for error figures near zero). Output vectors and normalisers carried across
// tiles are double in both.
enum ErrMode { kExactSide = 0, kApproxSide = 1 };

// One thread block's view of its work (query head, tile of evaluation queries): the shared
// memory regions, the indices, and which (query, dim) outputs this thread owns. The kernel below
// runs the steps that follow on it, in order; each is inlined into the kernel.
template <typename Real, int kMode>
struct ErrBlock {
  static constexpr bool kFloat = sizeof(Real) == sizeof(float);
  static constexpr bool kExact = kMode == kExactSide;
  const ErrorDeviceArgs& a;
  ErrSmem L;
  unsigned char* smem;
  double *st_sx, *st_sq, *st_sd, *st_mass;  // exact normaliser, squared exact weights, z's
                                            // denominator, exact weight on the kept set
  Real *st_mx, *st_mn, *st_md;              // running maxima (exact, numerator, denominator)
  Real *st_ax, *st_an;                      // this tile's rescale factors (exact, numerator)
  Real *Qs, *S, *Px, *Pn;                   // queries, logits, [key][query] weights
  float *Ks, *Vs;
  int tid, lane, warp, qh, kvh, e0, nq, win, d, dv, kpitch, ex_pitch;
  // Output (query, dim) pairs of this thread. Column layout when kErrThreads is a multiple of dv
  // (dv = 16, 32, 64, 128, 256): thread t owns column c = t % dv for the `per` consecutive
  // queries q0 .. q0 + per - 1, so one V element feeds all of them. Otherwise pair r is
  // o = t + r * kErrThreads, (o / dv, o % dv).
  bool column;
  int per, col_c, col_q0;
  float scale;    // float logits: times 1/sqrt(d)
  double sqrt_d;  // double logits: over sqrt(d), as the CPU reference
  const float *keys, *values, *queries;
  double* exact;  // this tile's rows of the exact table ([eval][dv + 3]: vector, mx, sx, sq)
  size_t cbase;   // the approximate side visits this kv head's candidates only
  const int* cand;
  int count;

  __device__ __forceinline__ ErrBlock(const ErrorDeviceArgs& args, unsigned char* mem)
      : a(args), L(args.d, args.dv, sizeof(Real)), smem(mem) {
    st_sx = reinterpret_cast<double*>(smem + L.state_d);
    st_sq = st_sx + kErrQueries;
    st_sd = st_sq + kErrQueries;
    st_mass = st_sd + kErrQueries;
    st_mx = reinterpret_cast<Real*>(smem + L.state_f);
    st_mn = st_mx + kErrQueries;
    st_md = st_mn + kErrQueries;
    st_ax = st_md + kErrQueries;
    st_an = st_ax + kErrQueries;
    Qs = reinterpret_cast<Real*>(smem + L.q);
    S = reinterpret_cast<Real*>(smem + L.s);
    Px = reinterpret_cast<Real*>(smem + L.px);
    Pn = reinterpret_cast<Real*>(smem + L.pn);
    Ks = reinterpret_cast<float*>(smem + L.k);
    Vs = reinterpret_cast<float*>(smem + L.v);
    tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    qh = blockIdx.y;
    kvh = qh / (a.q_heads / a.kv_heads);
    e0 = blockIdx.x * kErrQueries;
    nq = min(kErrQueries, a.eval - e0);
    win = a.n - a.eval;
    d = a.d, dv = a.dv, kpitch = L.kpitch;
    ex_pitch = dv + 3;
    column = kErrThreads % dv == 0 && dv * kErrQueries >= kErrThreads;
    per = column ? kErrQueries * dv / kErrThreads : 0;
    col_c = column ? tid % dv : 0, col_q0 = column ? (tid / dv) * per : 0;
    scale = 1.0f / sqrtf(static_cast<float>(d));
    sqrt_d = sqrt(static_cast<double>(d));
    keys = a.keys[kvh];
    values = a.values[kvh];
    queries = a.queries[qh];
    exact = a.exact[qh] + static_cast<size_t>(e0) * ex_pitch;
    cbase = static_cast<size_t>(kvh) * a.cand_stride;
    cand = kExact ? nullptr : a.cand + cbase;
    const int j_last = win + e0 + nq - 1;
    count = kExact ? j_last + 1 : a.cand_count[kvh];
  }
  __device__ __forceinline__ bool output(int r, int* q, int* c) const {
    if (column) {
      *q = col_q0 + r;
      *c = col_c;
      return r < per;
    }
    const int o = tid + r * kErrThreads;
    *q = o / dv;
    *c = o % dv;
    return o < kErrQueries * dv;
  }
  __device__ __forceinline__ int token(int k) const { return kExact ? k : cand[k]; }
};

// The running states (the approximate side starts from the exact side's final maximum and sums)
// and the block's queries in shared memory.
template <typename Real, int kMode>
__device__ __forceinline__ void init_states(ErrBlock<Real, kMode>& B) {
  const int tid = B.tid;
  if (tid < kErrQueries) {
    B.st_sx[tid] = B.st_sq[tid] = B.st_sd[tid] = B.st_mass[tid] = 0.0;
    B.st_mx[tid] = B.st_mn[tid] = B.st_md[tid] = -INFINITY;
    if (!B.kExact && tid < B.nq) {
      const size_t row = static_cast<size_t>(tid) * B.ex_pitch;
      B.st_mx[tid] = static_cast<Real>(B.exact[row + B.dv]);
      B.st_sx[tid] = B.exact[row + B.dv + 1];
      B.st_sq[tid] = B.exact[row + B.dv + 2];
    }
  }
  for (int e = tid; e < kErrQueries * B.d; e += kErrThreads) {
    const int q = e / B.d;
    B.Qs[e] = q < B.nq ? static_cast<Real>(B.queries[static_cast<size_t>(B.e0 + q) * B.d + e % B.d])
                       : Real(0);
  }
}

// Keys and values of the tile's kt tokens (from k0) into shared memory, zero beyond.
template <typename Real, int kMode>
__device__ __forceinline__ void load_tile(ErrBlock<Real, kMode>& B, int k0, int kt) {
  const int d = B.d, dv = B.dv;
  for (int e = B.tid; e < kErrKeys * d; e += kErrThreads) {
    const int r = e / d, c = e % d;
    B.Ks[r * B.kpitch + c] = r < kt ? B.keys[static_cast<size_t>(B.token(k0 + r)) * d + c] : 0.0f;
  }
  if constexpr (ErrBlock<Real, kMode>::kExact) {
    for (int e = B.tid; e < kErrKeys * dv; e += kErrThreads)
      B.Vs[e] = e < kt * dv ? B.values[static_cast<size_t>(k0) * dv + e] : 0.0f;
  } else {
    for (int e = B.tid; e < kErrKeys * dv; e += kErrThreads) {
      const int r = e / dv, c = e % dv;
      B.Vs[e] = r < kt ? B.values[static_cast<size_t>(B.cand[k0 + r]) * dv + c] : 0.0f;
    }
  }
}

// Logits of every (query, key) pair of the tile; -inf where the key is after the query. Thread
// t: key t % 32 against queries t / 32 and t / 32 + 8 (one key row read for both).
template <typename Real, int kMode>
__device__ __forceinline__ void tile_logits(ErrBlock<Real, kMode>& B, int k0, int kt) {
  const int d = B.d;
  const int kk = B.tid % kErrKeys, qa = B.tid / kErrKeys, qb = qa + kErrQueries / 2;
  const float* kv = B.Ks + kk * B.kpitch;
  const Real* qva = B.Qs + qa * d;
  const Real* qvb = B.Qs + qb * d;
  Real da = 0, db = 0;
  if (kk < kt) {
    if constexpr (ErrBlock<Real, kMode>::kFloat) {
      if (B.L.vec) {
        for (int c = 0; c < d; c += 4) {
          const float4 k4 = *reinterpret_cast<const float4*>(kv + c);
          const float4 a4 = *reinterpret_cast<const float4*>(qva + c);
          const float4 b4 = *reinterpret_cast<const float4*>(qvb + c);
          da = fmaf(a4.x, k4.x, fmaf(a4.y, k4.y, fmaf(a4.z, k4.z, fmaf(a4.w, k4.w, da))));
          db = fmaf(b4.x, k4.x, fmaf(b4.y, k4.y, fmaf(b4.z, k4.z, fmaf(b4.w, k4.w, db))));
        }
      } else {
        for (int c = 0; c < d; ++c) {
          da = fmaf(qva[c], kv[c], da);
          db = fmaf(qvb[c], kv[c], db);
        }
      }
    } else {
      for (int c = 0; c < d; ++c) {
        const double k = kv[c];
        da = fma(qva[c], k, da);
        db = fma(qvb[c], k, db);
      }
    }
  }
  if constexpr (ErrBlock<Real, kMode>::kFloat) {
    da *= B.scale;
    db *= B.scale;
  } else {
    da /= B.sqrt_d;
    db /= B.sqrt_d;
  }
  const int i = kk < kt ? B.token(k0 + kk) : 0;
  const int last = B.win + B.e0;  // query q sees keys i <= last + q
  B.S[qa * kErrKeys + kk] = qa < B.nq && kk < kt && i <= last + qa ? da : Real(-INFINITY);
  B.S[qb * kErrKeys + kk] = qb < B.nq && kk < kt && i <= last + qb ? db : Real(-INFINITY);
}

// The exact side, per query: the tile's weights against the running maximum, and the
// normaliser and the sum of squared weights rescaled to it.
template <typename Real, int kMode>
__device__ __forceinline__ void tile_weights_exact(ErrBlock<Real, kMode>& B) {
  const int lane = B.lane;
  for (int q = B.warp; q < kErrQueries; q += kWarps) {
    const Real l = B.S[q * kErrKeys + lane];
    const bool valid = l > -INFINITY;
    const Real old_x = B.st_mx[q];
    const Real mx = fmax(old_x, warp_max(l));
    const Real px = valid ? exp_of(l - mx) : Real(0);
    B.Px[lane * kErrQueries + q] = px;
    const Real sum_x = warp_sum(px), sum_sq = warp_sum(px * px);
    __syncwarp();
    if (lane == 0) {
      const Real ax = rescale(old_x, mx);
      B.st_sx[q] = B.st_sx[q] * ax + sum_x;
      B.st_sq[q] = B.st_sq[q] * (static_cast<double>(ax) * ax) + sum_sq;
      B.st_mx[q] = mx;
      B.st_ax[q] = ax;
    }
  }
}

// The approximate side, per query: sinks and window weigh 1 in both sums; the middle's
// candidates their log weights (-inf in the set that does not hold them); every candidate is
// kept, its exact weight (against the exact maximum) added to the kept mass.
template <typename Real, int kMode>
__device__ __forceinline__ void tile_weights_approx(ErrBlock<Real, kMode>& B, int k0) {
  const int lane = B.lane;
  for (int q = B.warp; q < kErrQueries; q += kWarps) {
    const Real l = B.S[q * kErrKeys + lane];
    const bool valid = l > -INFINITY;
    const int i = valid ? B.cand[k0 + lane] : 0;
    Real lwn = -INFINITY, lwd = -INFINITY;
    if (valid) {
      if (i < B.a.sink || i >= B.win) {
        lwn = lwd = 0;
      } else {
        lwn = static_cast<Real>(B.a.cand_lwn[B.cbase + k0 + lane]);
        lwd = static_cast<Real>(B.a.cand_lwd[B.cbase + k0 + lane]);
      }
    }
    const Real ln = valid ? l + lwn : Real(-INFINITY);
    const Real ld = valid ? l + lwd : Real(-INFINITY);
    const Real old_n = B.st_mn[q], old_d = B.st_md[q];
    const Real mn = fmax(old_n, warp_max(ln));
    const Real md = fmax(old_d, warp_max(ld));
    const Real pn = ln > -INFINITY ? exp_of(ln - mn) : Real(0);
    const Real pd = ld > -INFINITY ? exp_of(ld - md) : Real(0);
    const Real pk = valid ? exp_of(l - B.st_mx[q]) : Real(0);
    B.Pn[lane * kErrQueries + q] = pn;
    const Real sum_d = warp_sum(pd), sum_kept = warp_sum(pk);
    __syncwarp();
    if (lane == 0) {
      const Real an = rescale(old_n, mn), ad = rescale(old_d, md);
      B.st_sd[q] = B.st_sd[q] * ad + sum_d;
      B.st_mass[q] += sum_kept;
      B.st_mn[q] = mn;
      B.st_md[q] = md;
      B.st_an[q] = an;
    }
  }
}

// Output vectors: the exact weights or the numerator's against the tile's values, added to the
// running sums rescaled to the new maxima.
template <typename Real, int kMaxOut, int kMode>
__device__ __forceinline__ void accumulate_outputs(const ErrBlock<Real, kMode>& B, int kt,
                                                   double (&acc)[kMaxOut]) {
  constexpr bool kExact = ErrBlock<Real, kMode>::kExact;
  const Real* P = kExact ? B.Px : B.Pn;
  const Real* resc = kExact ? B.st_ax : B.st_an;
  const int dv = B.dv;
  if (ErrBlock<Real, kMode>::kFloat && B.column && B.per % 4 == 0) {
    // One V element and float4s of the weights of this thread's `per` queries per key.
    float s[kMaxOut];
#pragma unroll
    for (int r = 0; r < kMaxOut; ++r) s[r] = 0.0f;
    for (int kk = 0; kk < kt; ++kk) {
      const float v = B.Vs[kk * dv + B.col_c];
      const float4* p4 = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(P) +
                                                         kk * kErrQueries + B.col_q0);
#pragma unroll
      for (int r4 = 0; r4 < kMaxOut / 4; ++r4) {
        if (4 * r4 < B.per) {
          const float4 x = p4[r4];
          s[4 * r4] = fmaf(x.x, v, s[4 * r4]);
          s[4 * r4 + 1] = fmaf(x.y, v, s[4 * r4 + 1]);
          s[4 * r4 + 2] = fmaf(x.z, v, s[4 * r4 + 2]);
          s[4 * r4 + 3] = fmaf(x.w, v, s[4 * r4 + 3]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kMaxOut; ++r)
      if (r < B.per) acc[r] = acc[r] * resc[B.col_q0 + r] + s[r];
  } else {
#pragma unroll
    for (int r = 0; r < kMaxOut; ++r) {
      int q, c;
      if (B.output(r, &q, &c)) {
        Real s = 0;
        for (int kk = 0; kk < kt; ++kk) {
          const Real v = B.Vs[kk * dv + c];
          s = fma(P[kk * kErrQueries + q], v, s);
        }
        acc[r] = acc[r] * resc[q] + s;
      }
    }
  }
}

// The exact side's end: Attn_j = acc / sx, and the maximum and sums the approximate side needs,
// into the exact table.
template <typename Real, int kMaxOut, int kMode>
__device__ __forceinline__ void finish_exact(const ErrBlock<Real, kMode>& B,
                                             const double (&acc)[kMaxOut]) {
#pragma unroll
  for (int r = 0; r < kMaxOut; ++r) {
    int q, c;
    if (B.output(r, &q, &c) && q < B.nq)
      B.exact[static_cast<size_t>(q) * B.ex_pitch + c] = acc[r] / B.st_sx[q];
  }
  if (B.tid < B.nq) {
    const size_t row = static_cast<size_t>(B.tid) * B.ex_pitch;
    B.exact[row + B.dv] = static_cast<double>(B.st_mx[B.tid]);
    B.exact[row + B.dv + 1] = B.st_sx[B.tid];
    B.exact[row + B.dv + 2] = B.st_sq[B.tid];
  }
}

// The approximate side's end: z_j = acc e^{mn} / (sd e^{md}) against the stored Attn_j. Squared
// differences per (query, dim) go to shared memory and are summed per query in a fixed order
// (deterministic); then the three figures as the CPU reference reports them.
template <typename Real, int kMaxOut, int kMode>
__device__ __forceinline__ void finish_approx(const ErrBlock<Real, kMode>& B,
                                              const double (&acc)[kMaxOut]) {
  const int dv = B.dv;
  double* fin_d2 = reinterpret_cast<double*>(B.smem + B.L.k);
  double* fin_a2 = fin_d2 + kErrQueries * dv;
#pragma unroll
  for (int r = 0; r < kMaxOut; ++r) {
    int q, c;
    if (B.output(r, &q, &c)) {
      const int o = q * dv + c;
      double d2 = 0.0, a2 = 0.0;
      if (q < B.nq) {
        const double ex = B.exact[static_cast<size_t>(q) * B.ex_pitch + c];
        const double approx =
            acc[r] * exp(static_cast<double>(B.st_mn[q]) - B.st_md[q]) / B.st_sd[q];
        d2 = (approx - ex) * (approx - ex);
        a2 = ex * ex;
      }
      fin_d2[o] = d2;
      fin_a2[o] = a2;
    }
  }
  __syncthreads();
  const ErrorDeviceArgs& a = B.a;
  for (int q = B.warp; q < B.nq; q += kWarps) {
    double d2 = 0.0, a2 = 0.0;
    for (int c = B.lane; c < dv; c += 32) {
      d2 += fin_d2[q * dv + c];
      a2 += fin_a2[q * dv + c];
    }
    d2 = warp_sum(d2);
    a2 = warp_sum(a2);
    if (B.lane == 0) {
      const int e = B.e0 + q;
      const double diff = sqrt(d2), exact_norm = sqrt(a2);
      const double softmax_norm = sqrt(B.st_sq[q]) / B.st_sx[q];
      const double v_frob = sqrt(a.v_sq_prefix[static_cast<size_t>(B.kvh) * a.eval + e]);
      const size_t out = static_cast<size_t>(B.qh) * a.eval + e;
      // As the CPU reference: a zero scale reports the absolute difference.
      a.relative[out] = exact_norm > 0 ? diff / exact_norm : diff;
      a.normalized[out] = v_frob > 0 ? diff / (softmax_norm * v_frob) : diff;
      a.mass[out] = B.st_mass[q] / B.st_sx[q];
    }
  }
}

// One thread block per (query head, tile of kErrQueries evaluation queries): the keys in tiles
// of kErrKeys, each tile's logits, weights and outputs, then the side's end.
template <typename Real, int kMaxOut, int kMode>  // kMaxOut: outputs (query, dim) per thread
__global__ void __launch_bounds__(kErrThreads) attention_error_kernel(ErrorDeviceArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  ErrBlock<Real, kMode> B(a, smem);
  init_states(B);
  double acc[kMaxOut];  // the exact side's output vector, or the numerator's
#pragma unroll
  for (int r = 0; r < kMaxOut; ++r) acc[r] = 0.0;
  for (int k0 = 0; k0 < B.count; k0 += kErrKeys) {
    const int kt = min(kErrKeys, B.count - k0);
    __syncthreads();  // the previous tile is consumed (and the set-up above is visible)
    load_tile(B, k0, kt);
    __syncthreads();
    tile_logits(B, k0, kt);
    __syncthreads();
    if constexpr (kMode == kExactSide)
      tile_weights_exact(B);
    else
      tile_weights_approx(B, k0);
    __syncthreads();
    accumulate_outputs<Real, kMaxOut, kMode>(B, kt, acc);
  }
  __syncthreads();
  if constexpr (kMode == kExactSide)
    finish_exact<Real, kMaxOut, kMode>(B, acc);
  else
    finish_approx<Real, kMaxOut, kMode>(B, acc);
}

void check_set(const std::vector<int>& idx, const std::vector<double>& logw, int kvh, int mid_begin,
               int mid_end, const char* which, std::vector<double>& dense) {
  if (idx.size() != logw.size())
    throw std::invalid_argument("attention_errors: kv head " + std::to_string(kvh) +
                                ": indices and log weights differ in length");
  for (size_t t = 0; t < idx.size(); ++t) {
    const int i = idx[t];
    if (i < mid_begin || i >= mid_end)
      throw std::out_of_range(std::string(which) + " selection index " + std::to_string(i) +
                              " is outside the middle [" + std::to_string(mid_begin) + ", " +
                              std::to_string(mid_end) + ")");
    double& slot = dense[static_cast<size_t>(i - mid_begin)];
    if (slot != -std::numeric_limits<double>::infinity())
      throw std::invalid_argument(std::string(which) + " selection holds token " +
                                  std::to_string(i) + " twice");
    slot = logw[t];
  }
}

// The batch's shape and arrays, checked as the CPU reference checks them.
void check_error_batch(const ErrorBatch& b) {
  if (b.kv_heads <= 0 || b.q_heads <= 0 || b.q_heads % b.kv_heads != 0)
    throw std::invalid_argument("attention_errors: " + std::to_string(b.q_heads) +
                                " query heads do not form groups over " +
                                std::to_string(b.kv_heads) + " kv heads");
  if (b.n <= 0 || b.sink < 0 || b.eval <= 0 || b.sink + b.eval > b.n)
    throw std::invalid_argument("attention: bad window n=" + std::to_string(b.n) +
                                " s=" + std::to_string(b.sink) + " E=" + std::to_string(b.eval));
  const auto kv = static_cast<size_t>(b.kv_heads);
  if (b.keys.size() != kv || b.values.size() != kv || b.num_idx.size() != kv ||
      b.den_idx.size() != kv || b.num_logw.size() != kv || b.den_logw.size() != kv ||
      b.queries.size() != static_cast<size_t>(b.q_heads))
    throw std::invalid_argument("attention_errors: per-head arrays do not match the head counts");
  if (b.d <= 0 || b.dv <= 0)  // degenerate heads: leave them to the CPU reference
    throw Unsupported("attention_errors: d=" + std::to_string(b.d) +
                      ", dv=" + std::to_string(b.dv) + " heads are not handled by the CUDA kernel");
  for (size_t h = 0; h < kv; ++h)
    if (!b.keys[h] || !b.values[h])
      throw std::invalid_argument("attention_errors: kv head " + std::to_string(h) +
                                  " has no keys or values");
  for (const float* q : b.queries)
    if (!q) throw std::invalid_argument("attention_errors: a query head has no queries");
}

// Each kv head's candidates for the approximate side, ascending: the sinks, the tokens of the
// middle either selection holds (with both log weights, -inf in the set without them), the
// window; flattened at one stride for the upload. The selections are checked as the CPU
// reference checks them.
struct Candidates {
  size_t stride = 1;
  std::vector<int> flat, count;  // [kv][stride] tokens, [kv] how many
  std::vector<double> lwn, lwd;  // [kv][stride] numerator and denominator log weights
};

Candidates gather_candidates(const ErrorBatch& b) {
  const auto kv = static_cast<size_t>(b.kv_heads);
  const int mid_begin = b.sink, mid_end = b.n - b.eval;
  const size_t n_mid = static_cast<size_t>(mid_end - mid_begin);
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  std::vector<std::vector<int>> cand(kv);
  std::vector<std::vector<double>> cand_num(kv), cand_den(kv);
  size_t stride = 1;
  for (size_t h = 0; h < kv; ++h) {
    std::vector<double> num(n_mid, kNone), den(n_mid, kNone);
    check_set(b.num_idx[h], b.num_logw[h], static_cast<int>(h), mid_begin, mid_end, "numerator",
              num);
    check_set(b.den_idx[h], b.den_logw[h], static_cast<int>(h), mid_begin, mid_end, "denominator",
              den);
    auto add = [&](int token, double lwn, double lwd) {
      cand[h].push_back(token);
      cand_num[h].push_back(lwn);
      cand_den[h].push_back(lwd);
    };
    for (int i = 0; i < mid_begin; ++i) add(i, 0, 0);
    for (size_t t = 0; t < n_mid; ++t)
      if (num[t] != kNone || den[t] != kNone) add(mid_begin + static_cast<int>(t), num[t], den[t]);
    for (int i = mid_end; i < b.n; ++i) add(i, 0, 0);
    stride = std::max(stride, cand[h].size());
  }
  Candidates c;
  c.stride = stride;
  c.flat.assign(kv * stride, 0);
  c.count.resize(kv);
  c.lwn.assign(kv * stride, kNone);
  c.lwd.assign(kv * stride, kNone);
  for (size_t h = 0; h < kv; ++h) {
    c.count[h] = static_cast<int>(cand[h].size());
    std::copy(cand[h].begin(), cand[h].end(), c.flat.begin() + h * stride);
    std::copy(cand_num[h].begin(), cand_num[h].end(), c.lwn.begin() + h * stride);
    std::copy(cand_den[h].begin(), cand_den[h].end(), c.lwd.begin() + h * stride);
  }
  return c;
}

// Where the kernels read each head: `table` gets [kv keys][kv values][q_heads evaluation query
// rows] and `exact` the query heads' exact tables. For a named layer (b.layer_id) with room in
// the resident budget, the resident copies (uploaded on first use) and the kept exact sides;
// returns whether the exact side must be computed in this call. Otherwise this call's workspace,
// copied now.
bool place_heads(const ErrorBatch& b, ErrorWorkspace& ws, ResidentLayers* resident,
                 cudaStream_t stream, std::vector<const float*>& table,
                 std::vector<double*>& exact) {
  const auto kv = static_cast<size_t>(b.kv_heads);
  const size_t q_heads = static_cast<size_t>(b.q_heads);
  const size_t n = b.n, d = b.d, dv = b.dv, E = b.eval;
  const size_t key_bytes = n * d * sizeof(float), value_bytes = n * dv * sizeof(float);
  const size_t query_bytes = E * d * sizeof(float);
  const size_t exact_bytes = E * (dv + 3) * sizeof(double);
  if (resident && b.layer_id != 0 &&
      resident->begin_call(kv * (key_bytes + value_bytes) +
                           q_heads * (query_bytes + (b.float_scores ? 0 : exact_bytes)))) {
    std::vector<uint64_t> key_copy(kv), value_copy(kv);
    for (size_t h = 0; h < kv; ++h) {
      table[h] = static_cast<const float*>(
          resident->find_or_upload(b.layer_id, b.keys[h], key_bytes, stream, &key_copy[h]));
      table[kv + h] = static_cast<const float*>(
          resident->find_or_upload(b.layer_id, b.values[h], value_bytes, stream, &value_copy[h]));
    }
    const size_t group = q_heads / kv;
    bool all_kept = !b.float_scores;
    for (size_t h = 0; h < q_heads; ++h) {  // the evaluation rows only
      const float* rows = b.queries[h] + (n - E) * d;
      uint64_t query_copy = 0;
      table[2 * kv + h] = static_cast<const float*>(
          resident->find_or_upload(b.layer_id, rows, query_bytes, stream, &query_copy));
      if (b.float_scores) continue;  // the float exact side is not kept
      // The exact side of this query head over this window, kept while the copies it was
      // computed from are.
      bool fresh = false;
      exact[h] = static_cast<double*>(resident->find_or_make_derived(
          b.layer_id, rows, exact_bytes, {key_copy[h / group], value_copy[h / group], query_copy},
          &fresh));
      all_kept = all_kept && !fresh;
    }
    return !all_kept;
  } else {
    float* keys = ws.keys.reserve_as<float>(kv * n * d);
    float* values = ws.values.reserve_as<float>(kv * n * dv);
    float* queries = ws.queries.reserve_as<float>(q_heads * E * d);
    for (size_t h = 0; h < kv; ++h) {
      table[h] = keys + h * n * d;
      table[kv + h] = values + h * n * dv;
      KVS_CUDA_CHECK(
          cudaMemcpyAsync(keys + h * n * d, b.keys[h], key_bytes, cudaMemcpyHostToDevice, stream));
      KVS_CUDA_CHECK(cudaMemcpyAsync(values + h * n * dv, b.values[h], value_bytes,
                                     cudaMemcpyHostToDevice, stream));
    }
    for (size_t h = 0; h < q_heads; ++h) {  // the evaluation rows only
      table[2 * kv + h] = queries + h * E * d;
      KVS_CUDA_CHECK(cudaMemcpyAsync(queries + h * E * d, b.queries[h] + (n - E) * d, query_bytes,
                                     cudaMemcpyHostToDevice, stream));
    }
  }
  return true;
}

}  // namespace

ErrorDeviceArgs upload_error_batch(const ErrorBatch& b, ErrorWorkspace& ws,
                                   ResidentLayers* resident, cudaStream_t stream) {
  check_error_batch(b);
  const auto kv = static_cast<size_t>(b.kv_heads);
  const size_t dv = b.dv, E = b.eval;
  const Candidates c = gather_candidates(b);
  const size_t stride = c.stride;

  ErrorDeviceArgs a;
  a.n = b.n;
  a.d = b.d;
  a.dv = b.dv;
  a.q_heads = b.q_heads;
  a.kv_heads = b.kv_heads;
  a.sink = b.sink;
  a.eval = b.eval;
  a.float_scores = b.float_scores;
  a.cand_stride = static_cast<int>(stride);
  int* cand_dev = ws.cand.reserve_as<int>(kv * stride + kv);
  double* lw_num = ws.lw_num.reserve_as<double>(kv * stride);
  double* lw_den = ws.lw_den.reserve_as<double>(kv * stride);
  double* v_sq = ws.v_sq.reserve_as<double>(kv * E);
  double* out = ws.out.reserve_as<double>(3 * b.q_heads * E);
  const size_t q_heads = static_cast<size_t>(b.q_heads);
  std::vector<const float*> table(2 * kv + q_heads);
  std::vector<double*> exact(q_heads);
  a.compute_exact = place_heads(b, ws, resident, stream, table, exact);
  if (!exact[0] || b.float_scores) {  // the exact side in this call's workspace
    double* ex = ws.exact.reserve_as<double>(q_heads * E * (dv + 3));
    for (size_t h = 0; h < q_heads; ++h) exact[h] = ex + h * E * (dv + 3);
    a.compute_exact = true;
  }
  const float** tables = ws.tables.reserve_as<const float*>(table.size());
  double** exact_tables = ws.exact_tables.reserve_as<double*>(q_heads);
  KVS_CUDA_CHECK(cudaMemcpyAsync(tables, table.data(), table.size() * sizeof(const float*),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(exact_tables, exact.data(), q_heads * sizeof(double*),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(cand_dev, c.flat.data(), c.flat.size() * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(cand_dev + kv * stride, c.count.data(), kv * sizeof(int),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(lw_num, c.lwn.data(), c.lwn.size() * sizeof(double),
                                 cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(lw_den, c.lwd.data(), c.lwd.size() * sizeof(double),
                                 cudaMemcpyHostToDevice, stream));
  // The host vectors die with this function: finish the copies first.
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  a.keys = tables;
  a.values = tables + kv;
  a.queries = tables + 2 * kv;
  a.exact = exact_tables;
  a.cand = cand_dev;
  a.cand_count = cand_dev + kv * stride;
  a.cand_lwn = lw_num;
  a.cand_lwd = lw_den;
  a.v_sq_prefix = v_sq;
  a.relative = out;
  a.normalized = out + b.q_heads * E;
  a.mass = out + 2 * b.q_heads * E;
  return a;
}

size_t attention_error_smem_bytes(int d, int dv, int device_smem_optin, bool float_scores) {
  if (dv > kErrMaxDv || d <= 0 || dv <= 0) return 0;
  const size_t bytes =
      padded_smem(ErrSmem(d, dv, float_scores ? sizeof(float) : sizeof(double)).total);
  return bytes <= static_cast<size_t>(device_smem_optin) ? bytes : 0;
}

void launch_attention_errors(const ErrorDeviceArgs& a, int device_smem_optin, cudaStream_t stream) {
  const size_t smem = attention_error_smem_bytes(a.d, a.dv, device_smem_optin, a.float_scores);
  if (smem == 0)
    throw Unsupported("attention_errors: head dims d=" + std::to_string(a.d) +
                      ", dv=" + std::to_string(a.dv) +
                      " exceed what the CUDA kernel supports (dv <= " + std::to_string(kErrMaxDv) +
                      ", shared memory)");
  v_sq_prefix_kernel<<<a.kv_heads, kErrThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("v_sq_prefix_kernel");
  const dim3 grid((a.eval + kErrQueries - 1) / kErrQueries, a.q_heads);
  const int outputs_per_thread = (kErrQueries * a.dv + kErrThreads - 1) / kErrThreads;
  using Kernel = void (*)(ErrorDeviceArgs);
  Kernel exact = nullptr, approx = nullptr;
  if (a.float_scores) {
    exact = outputs_per_thread <= 8 ? attention_error_kernel<float, 8, kExactSide>
                                    : attention_error_kernel<float, 16, kExactSide>;
    approx = outputs_per_thread <= 8 ? attention_error_kernel<float, 8, kApproxSide>
                                     : attention_error_kernel<float, 16, kApproxSide>;
  } else {
    exact = outputs_per_thread <= 8 ? attention_error_kernel<double, 8, kExactSide>
                                    : attention_error_kernel<double, 16, kExactSide>;
    approx = outputs_per_thread <= 8 ? attention_error_kernel<double, 8, kApproxSide>
                                     : attention_error_kernel<double, 16, kApproxSide>;
  }
  if (a.compute_exact) {
    KVS_CUDA_CHECK(cudaFuncSetAttribute(exact, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
    exact<<<grid, kErrThreads, smem, stream>>>(a);
    KVS_CUDA_CHECK_LAUNCH("attention_error_kernel (exact side)");
  }
  KVS_CUDA_CHECK(cudaFuncSetAttribute(approx, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  approx<<<grid, kErrThreads, smem, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("attention_error_kernel (approximate side)");
}

void download_error_outputs(const ErrorDeviceArgs& a, const ErrorBatch& b, cudaStream_t stream) {
  const size_t count = static_cast<size_t>(b.q_heads) * b.eval;
  if (b.relative)
    KVS_CUDA_CHECK(cudaMemcpyAsync(b.relative, a.relative, count * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream));
  if (b.normalized)
    KVS_CUDA_CHECK(cudaMemcpyAsync(b.normalized, a.normalized, count * sizeof(double),
                                   cudaMemcpyDeviceToHost, stream));
  if (b.mass)
    KVS_CUDA_CHECK(
        cudaMemcpyAsync(b.mass, a.mass, count * sizeof(double), cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::attention_errors(const ErrorBatch& b) {
  // What the kernels' tiles cannot hold is known before any upload.
  if (b.d > 0 && b.dv > 0 &&
      attention_error_smem_bytes(b.d, b.dv, smem_optin_, b.float_scores) == 0)
    throw DeviceFailure("head dims d=" + std::to_string(b.d) + ", dv=" + std::to_string(b.dv) +
                        " exceed the CUDA kernel's tiles");
  guarded([&] {
    const ErrorDeviceArgs a =
        upload_error_batch(b, workspace<ErrorWorkspace>(Op::attention_errors), &resident_, stream_);
    launch([a, this] { launch_attention_errors(a, smem_optin_, stream_); });
    resident_.mark_ready();  // the exact sides made in this call are enqueued
    download_error_outputs(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
