// t-SNE of one kv head's keys of a long capture, as the Geometry view and `kvscope-cli embed` run
// it, with the memory of the t-SNE itself: the keys are copied out and the layer is dropped before
// the run, and the resident set is sampled every iteration. Not a Google Benchmark (one run of a
// few seconds is the measurement); bench/peers.sh runs it next to scikit-learn.
//
//   bench_tsne_long CAPTURE [--layer L] [--head H] [--iterations 1000] [--theta T] [--out CSV]
// theta < 0 (default): automatic (FFT interpolation above 10000 points); 0.5: Barnes-Hut.
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>

#include "engine/geometry/tsne.h"
#include "engine/io/capture.h"

namespace {

double rss_mib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1048576.0);
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s CAPTURE [--layer L] [--head H] [--iterations N] [--theta T] "
                 "[--out CSV]\n",
                 argv[0]);
    return 2;
  }
  int layer = 0, head = 0, iterations = 1000;
  double theta = -1;
  long fft_above = -1;
  std::string out;
  for (int a = 2; a + 1 < argc; a += 2) {
    const std::string flag = argv[a];
    if (flag == "--layer")
      layer = std::atoi(argv[a + 1]);
    else if (flag == "--head")
      head = std::atoi(argv[a + 1]);
    else if (flag == "--iterations")
      iterations = std::atoi(argv[a + 1]);
    else if (flag == "--theta")
      theta = std::atof(argv[a + 1]);
    else if (flag == "--fft-above")
      fft_above = std::atol(argv[a + 1]);
    else if (flag == "--out")
      out = argv[a + 1];
    else {
      std::fprintf(stderr, "bench_tsne_long: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  kvscope::MatrixF keys;
  {
    auto capture = kvscope::CaptureFile::open(argv[1]);
    keys = capture->layer(layer)->keys.at(head);
  }
  malloc_trim(0);
  const double rss_before = rss_mib();
  const double cpu0 = cpu_seconds();
  const auto wall0 = std::chrono::steady_clock::now();
  kvscope::TsneParams params;
  params.iterations = iterations;
  params.exaggeration_iterations = std::min(250, iterations);
  params.theta = theta;
  if (fft_above >= 0) params.fft_threshold = static_cast<int>(fft_above);
  kvscope::TsneRun run(keys, params);
  const double setup_cpu = cpu_seconds() - cpu0;
  double peak = rss_mib();
  while (!run.done()) {
    run.step(1);
    peak = std::max(peak, rss_mib());
  }
  const double cpu = cpu_seconds() - cpu0;
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  std::printf(
      "{\"points\": %d, \"d\": %d, \"iterations\": %d, \"gradient\": \"%s\", \"cpu_s\": %.2f, "
      "\"setup_cpu_s\": %.2f, \"wall_s\": %.2f, \"kl\": %.4f, \"tsne_peak_mib\": %.1f, "
      "\"keys_mib\": %.1f}\n",
      static_cast<int>(keys.rows()), static_cast<int>(keys.cols()), iterations,
      run.gradient_name().c_str(), cpu, setup_cpu, wall, run.kl(), peak - rss_before,
      keys.size() * 4 / 1048576.0);
  if (!out.empty()) {
    std::ofstream csv(out);
    csv << "token,x,y\n";
    for (Eigen::Index i = 0; i < run.embedding().rows(); ++i)
      csv << i << "," << run.embedding()(i, 0) << "," << run.embedding()(i, 1) << "\n";
  }
  return 0;
}
