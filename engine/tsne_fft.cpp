// FFT-accelerated interpolation of the t-SNE repulsion (see tsne_fft.h for the method).
#include "engine/tsne_fft.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvscope {
namespace {

// Static split of [0, n) over the cores; each index is handled by exactly one thread.
template <class Fn>
void parallel_ranges(int n, int min_per_thread, Fn&& fn) {
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  const int threads = std::max(1, std::min(hw, n / std::max(1, min_per_thread)));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  const int chunk = (n + threads - 1) / threads;
  for (int t = 1; t < threads; ++t) {
    const int b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(0, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

// Precision of the FFT grids.
using GridReal = double;

// Columns per strip of the column FFTs: 16 doubles = two cache lines per row and array, so a
// strip of the largest grid (1024 rows) stays in L2 through all its stages.
constexpr int kStrip = 16;

// A complex M x M grid in split form (re, im), row-major with a padded row stride: a stride of
// a power of two bytes would map every row of a strip to the same cache sets.
struct Grid {
  int M = 0, ld = 0;
  std::vector<GridReal> re, im;
  void reset(int m) {
    M = m;
    ld = m + 8;
    re.assign(static_cast<size_t>(m) * ld, 0.0);
    im.assign(static_cast<size_t>(m) * ld, 0.0);
  }
  size_t at(int row, int col) const { return static_cast<size_t>(row) * ld + col; }
};

// Radix-2 FFTs along the row index of columns [c0, c1) of an M x M split-complex grid, one strip
// of columns at a time with every butterfly vectorised across the strip. Forward: decimation in
// frequency, sign -1, output rows in bit-reversed order. Inverse: decimation in time, sign +1,
// input rows in bit-reversed order, output natural (unscaled). A forward pass followed by the
// inverse is M times the identity, and a pointwise product in between (in the same scrambled
// order) is a circular convolution: the order never needs to be undone.
class ColumnFft {
 public:
  explicit ColumnFft(int M) : M_(M), cos_(M / 2), sin_(M / 2) {
    for (int k = 0; k < M / 2; ++k) {
      const double a = 2.0 * M_PI * k / M;
      cos_[k] = std::cos(a);
      sin_[k] = std::sin(a);
    }
  }
  int size() const { return M_; }

  void forward(Grid& g, int c0, int c1) const { run(g, c0, c1, false); }
  void inverse(Grid& g, int c0, int c1) const { run(g, c0, c1, true); }

 private:
  void run(Grid& g, int c0, int c1, bool inverse) const {
    const int strips = (c1 - c0 + kStrip - 1) / kStrip;
    parallel_ranges(strips, 4, [&](int sb, int se) {
      for (int s = sb; s < se; ++s) {
        const int b = c0 + s * kStrip, e = std::min(c1, b + kStrip);
        if (e - b == kStrip) {
          inverse ? strip_dit<kStrip>(g, b, kStrip) : strip_dif<kStrip>(g, b, kStrip);
        } else {
          inverse ? strip_dit<0>(g, b, e - b) : strip_dif<0>(g, b, e - b);
        }
      }
    });
  }

  // Twiddle exp(sign 2 pi i k / len) for 0 <= k < len, len dividing M.
  double tw_re(int k, int len) const {
    const int t = k * (M_ / len);  // in [0, M)
    return t < M_ / 2 ? cos_[t] : -cos_[t - M_ / 2];
  }
  double tw_im(int k, int len) const {
    const int t = k * (M_ / len);
    return t < M_ / 2 ? sin_[t] : -sin_[t - M_ / 2];
  }

  // Radix-4 stages (two radix-2 stages in one pass over the strip), then one radix-2 stage when
  // log2 M is odd. W = kStrip for a full strip (unrolled and vectorised), 0 for a partial one.
  template <int W>
  void strip_dif(Grid& g, int col, int width) const {
    const int M = M_;
    const size_t ld = g.ld;
    const int w = W ? W : width;
    GridReal* re = g.re.data() + col;
    GridReal* im = g.im.data() + col;
    int len = M;
    for (; len >= 4; len /= 4) {
      const int q = len / 4;
      for (int start = 0; start < M; start += len)
        for (int k = 0; k < q; ++k) {
          // Forward: w = exp(-2 pi i / len).
          const double w1r = tw_re(k, len), w1i = -tw_im(k, len);
          const double w2r = tw_re(2 * k, len), w2i = -tw_im(2 * k, len);
          const double w3r = tw_re(3 * k, len), w3i = -tw_im(3 * k, len);
          GridReal* r0 = re + (start + k) * ld;
          GridReal* i0 = im + (start + k) * ld;
          GridReal* r1 = r0 + q * ld;
          GridReal* i1 = i0 + q * ld;
          GridReal* r2 = r1 + q * ld;
          GridReal* i2 = i1 + q * ld;
          GridReal* r3 = r2 + q * ld;
          GridReal* i3 = i2 + q * ld;
#pragma GCC ivdep
          for (int c = 0; c < w; ++c) {
            const double s0r = r0[c] + r2[c], s0i = i0[c] + i2[c];
            const double s1r = r1[c] + r3[c], s1i = i1[c] + i3[c];
            const double a1r = r0[c] - r2[c], a1i = i0[c] - i2[c];
            // a3 = -i (x1 - x3)
            const double a3r = i1[c] - i3[c], a3i = r3[c] - r1[c];
            r0[c] = s0r + s1r;
            i0[c] = s0i + s1i;
            const double y1r = s0r - s1r, y1i = s0i - s1i;
            r1[c] = y1r * w2r - y1i * w2i;
            i1[c] = y1r * w2i + y1i * w2r;
            const double y2r = a1r + a3r, y2i = a1i + a3i;
            r2[c] = y2r * w1r - y2i * w1i;
            i2[c] = y2r * w1i + y2i * w1r;
            const double y3r = a1r - a3r, y3i = a1i - a3i;
            r3[c] = y3r * w3r - y3i * w3i;
            i3[c] = y3r * w3i + y3i * w3r;
          }
        }
    }
    if (len == 2)
      for (int start = 0; start < M; start += 2) {
        GridReal* ar = re + start * ld;
        GridReal* ai = im + start * ld;
        GridReal* br = ar + ld;
        GridReal* bi = ai + ld;
#pragma GCC ivdep
        for (int c = 0; c < w; ++c) {
          const double ur = ar[c], ui = ai[c];
          ar[c] = ur + br[c];
          ai[c] = ui + bi[c];
          br[c] = ur - br[c];
          bi[c] = ui - bi[c];
        }
      }
  }

  template <int W>
  void strip_dit(Grid& g, int col, int width) const {
    const int M = M_;
    const size_t ld = g.ld;
    const int w = W ? W : width;
    GridReal* re = g.re.data() + col;
    GridReal* im = g.im.data() + col;
    int levels = 0;
    while ((1 << levels) < M) ++levels;
    int len = 2;
    if (levels % 2 == 1) {
      for (int start = 0; start < M; start += 2) {
        GridReal* ar = re + start * ld;
        GridReal* ai = im + start * ld;
        GridReal* br = ar + ld;
        GridReal* bi = ai + ld;
#pragma GCC ivdep
        for (int c = 0; c < w; ++c) {
          const double ur = ar[c], ui = ai[c];
          ar[c] = ur + br[c];
          ai[c] = ui + bi[c];
          br[c] = ur - br[c];
          bi[c] = ui - bi[c];
        }
      }
      len = 8;
    } else {
      len = 4;
    }
    for (; len <= M; len *= 4) {
      const int q = len / 4;
      for (int start = 0; start < M; start += len)
        for (int k = 0; k < q; ++k) {
          // Inverse: w = exp(+2 pi i / len).
          const double w1r = tw_re(k, len), w1i = tw_im(k, len);
          const double w2r = tw_re(2 * k, len), w2i = tw_im(2 * k, len);
          GridReal* r0 = re + (start + k) * ld;
          GridReal* i0 = im + (start + k) * ld;
          GridReal* r1 = r0 + q * ld;
          GridReal* i1 = i0 + q * ld;
          GridReal* r2 = r1 + q * ld;
          GridReal* i2 = i1 + q * ld;
          GridReal* r3 = r2 + q * ld;
          GridReal* i3 = i2 + q * ld;
#pragma GCC ivdep
          for (int c = 0; c < w; ++c) {
            // Stage len/2 on both halves (twiddle w^2k), then stage len (w^k, and w^k i).
            const double t1r = r1[c] * w2r - i1[c] * w2i, t1i = r1[c] * w2i + i1[c] * w2r;
            const double t3r = r3[c] * w2r - i3[c] * w2i, t3i = r3[c] * w2i + i3[c] * w2r;
            const double x0r = r0[c] + t1r, x0i = i0[c] + t1i;
            const double x1r = r0[c] - t1r, x1i = i0[c] - t1i;
            const double x2r = r2[c] + t3r, x2i = i2[c] + t3i;
            const double x3r = r2[c] - t3r, x3i = i2[c] - t3i;
            const double u2r = x2r * w1r - x2i * w1i, u2i = x2r * w1i + x2i * w1r;
            // x3 w^k i
            const double v3r = x3r * w1r - x3i * w1i, v3i = x3r * w1i + x3i * w1r;
            const double u3r = -v3i, u3i = v3r;
            r0[c] = x0r + u2r;
            i0[c] = x0i + u2i;
            r2[c] = x0r - u2r;
            i2[c] = x0i - u2i;
            r1[c] = x1r + u3r;
            i1[c] = x1i + u3i;
            r3[c] = x1r - u3r;
            i3[c] = x1i - u3i;
          }
        }
    }
  }

  int M_;
  std::vector<double> cos_, sin_;
};

// In-place transpose of both parts, in 32 x 32 tiles.
void transpose(Grid& g) {
  const int M = g.M;
  constexpr int T = 32;
  const int tiles = (M + T - 1) / T;
  parallel_ranges(tiles, 2, [&](int tb, int te) {
    for (int ti = tb; ti < te; ++ti)
      for (int tj = ti; tj < tiles; ++tj)
        for (std::vector<GridReal>* part : {&g.re, &g.im}) {
          GridReal* a = part->data();
          for (int i = ti * T; i < std::min(M, ti * T + T); ++i)
            for (int j = (ti == tj ? i + 1 : tj * T); j < std::min(M, tj * T + T); ++j)
              std::swap(a[g.at(i, j)], a[g.at(j, i)]);
        }
  });
}

}  // namespace

// The state kept across iterations: the FFT plan and the kernel's spectrum, reused while the
// padded size and the node spacing stay the same (the spacing is rounded up to steps of 2^(1/32)
// so a slowly growing embedding reuses it for several iterations).
struct TsneFftRepulsion::State {
  int M = 0;
  double spacing = 0;
  std::vector<GridReal> kernel_hat;  // real (the kernel is even), scrambled like the transforms
  std::unique_ptr<ColumnFft> fft;
  Grid a, b;  // charges 1 + i y_x and y_y + i |y|^2
};

TsneFftRepulsion::TsneFftRepulsion(const TsneFftParams& params)
    : params_(params), state_(std::make_unique<State>()) {
  if (params_.nodes_per_box < 2 || params_.min_boxes < 1 || !(params_.max_box > 0))
    throw std::invalid_argument("t-SNE FFT: bad interpolation parameters");
}
TsneFftRepulsion::~TsneFftRepulsion() = default;

void TsneFftRepulsion::compute(const float* y, int n, double* rep, double* z_each) {
  State& st = *state_;
  const int p = params_.nodes_per_box;
  double minx = y[0], maxx = y[0], miny = y[1], maxy = y[1];
  for (int i = 1; i < n; ++i) {
    minx = std::min(minx, double(y[2 * i]));
    maxx = std::max(maxx, double(y[2 * i]));
    miny = std::min(miny, double(y[2 * i + 1]));
    maxy = std::max(maxy, double(y[2 * i + 1]));
  }
  const double extent = std::max({maxx - minx, maxy - miny, 1e-6}) * (1 + 1e-9);

  // Boxes per side: enough for h <= max_box and at least min_boxes; then the smallest
  // power-of-two FFT side M with N = boxes * p <= (M + 1) / 2 (no wrap-around in the circular
  // convolution), and as many boxes as that M allows (finer boxes at no extra cost).
  const int wanted =
      std::max(params_.min_boxes, static_cast<int>(std::ceil(extent / params_.max_box)));
  int M = 16;
  while ((M + 1) / 2 / p < wanted) M *= 2;
  const int boxes = (M + 1) / 2 / p;
  const int N = boxes * p;
  double h = extent / boxes;
  h = std::exp2(std::ceil(std::log2(h) * 32) / 32);  // quantised: the spectrum is reused
  const double spacing = h / p;                      // of the node lattice
  const double cx = (minx + maxx) / 2, cy = (miny + maxy) / 2;
  const double x0 = cx - boxes * h / 2, y0 = cy - boxes * h / 2;

  if (st.M != M) {
    st.fft = std::make_unique<ColumnFft>(M);
    st.M = M;
    st.spacing = 0;
  }
  const ColumnFft& fft = *st.fft;
  if (st.spacing != spacing) {
    // The kernel w^2 at every lattice offset (a, b), |a|, |b| < N, placed circulantly.
    Grid& k = st.a;
    k.reset(M);
    for (int a = -(N - 1); a < N; ++a)
      for (int b = -(N - 1); b < N; ++b) {
        const double dx = a * spacing, dy = b * spacing;
        const double w = 1.0 / (1.0 + dx * dx + dy * dy);
        k.re[k.at((a + M) % M, (b + M) % M)] = static_cast<GridReal>(w * w);
      }
    fft.forward(k, 0, M);
    transpose(k);
    fft.forward(k, 0, M);
    st.kernel_hat = k.re;
    st.spacing = spacing;
  }

  // Lagrange weights of every point in its box along x and y, and its node offsets.
  std::vector<double> nodes(p), denom(p);
  for (int k = 0; k < p; ++k) nodes[k] = (k + 0.5) / p;
  for (int k = 0; k < p; ++k) {
    denom[k] = 1;
    for (int l = 0; l < p; ++l)
      if (l != k) denom[k] *= nodes[k] - nodes[l];
  }
  std::vector<double> wx(static_cast<size_t>(n) * p), wy(static_cast<size_t>(n) * p);
  std::vector<int> gx(n), gy(n);
  parallel_ranges(n, 4096, [&](int b, int e) {
    for (int i = b; i < e; ++i) {
      for (int axis = 0; axis < 2; ++axis) {
        const double u = (y[2 * i + axis] - (axis ? y0 : x0)) / h;
        const int box = std::clamp(static_cast<int>(u), 0, boxes - 1);
        const double t = u - box;
        double* w = (axis ? wy.data() : wx.data()) + static_cast<size_t>(i) * p;
        for (int k = 0; k < p; ++k) {
          double v = 1;
          for (int l = 0; l < p; ++l)
            if (l != k) v *= t - nodes[l];
          w[k] = v / denom[k];
        }
        (axis ? gy : gx)[i] = box * p;
      }
    }
  });

  // Spread the four charges (relative to the grid centre) onto the nodes.
  st.a.reset(M);
  st.b.reset(M);
  for (int i = 0; i < n; ++i) {
    const double px = y[2 * i] - cx, py = y[2 * i + 1] - cy;
    const double c1 = px, c2 = py, c3 = px * px + py * py;
    const double* ux = &wx[static_cast<size_t>(i) * p];
    const double* uy = &wy[static_cast<size_t>(i) * p];
    for (int kx = 0; kx < p; ++kx) {
      const size_t row = st.a.at(gx[i] + kx, gy[i]);
      for (int ky = 0; ky < p; ++ky) {
        const double w = ux[kx] * uy[ky];
        st.a.re[row + ky] += w;
        st.a.im[row + ky] += w * c1;
        st.b.re[row + ky] += w * c2;
        st.b.im[row + ky] += w * c3;
      }
    }
  }

  // Convolve both grids with the kernel: only the first N columns hold charges, and only the
  // first N rows and columns of the result are read.
  const double scale = 1.0 / (static_cast<double>(M) * M);
  for (Grid* g : {&st.a, &st.b}) {
    fft.forward(*g, 0, N);
    transpose(*g);
    fft.forward(*g, 0, M);
    const GridReal* kh = st.kernel_hat.data();
    GridReal* re = g->re.data();
    GridReal* im = g->im.data();
    const size_t total = g->re.size();  // the padding columns are zero in both
    for (size_t t = 0; t < total; ++t) {
      re[t] *= kh[t] * static_cast<GridReal>(scale);
      im[t] *= kh[t] * static_cast<GridReal>(scale);
    }
    fft.inverse(*g, 0, M);
    transpose(*g);
    fft.inverse(*g, 0, N);
  }

  // Interpolate the potentials back to the points; forces and Z_i from them.
  parallel_ranges(n, 4096, [&](int b, int e) {
    for (int i = b; i < e; ++i) {
      const double* ux = &wx[static_cast<size_t>(i) * p];
      const double* uy = &wy[static_cast<size_t>(i) * p];
      double phi[4] = {0, 0, 0, 0};
      for (int kx = 0; kx < p; ++kx) {
        const size_t row = st.a.at(gx[i] + kx, gy[i]);
        for (int ky = 0; ky < p; ++ky) {
          const double w = ux[kx] * uy[ky];
          phi[0] += w * st.a.re[row + ky];
          phi[1] += w * st.a.im[row + ky];
          phi[2] += w * st.b.re[row + ky];
          phi[3] += w * st.b.im[row + ky];
        }
      }
      const double px = y[2 * i] - cx, py = y[2 * i + 1] - cy;
      rep[2 * i] = px * phi[0] - phi[1];
      rep[2 * i + 1] = py * phi[0] - phi[2];
      // The j = i term adds exactly 1 (w_ii = 1): taken out.
      z_each[i] = (1 + px * px + py * py) * phi[0] - 2 * (px * phi[1] + py * phi[2]) + phi[3] - 1;
    }
  });
  last_fft_side_ = M;
  last_box_ = h;
}

}  // namespace kvscope
