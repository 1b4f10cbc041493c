#include "engine/backend.h"

#include <memory>
#include <mutex>

#include "engine/cpu_ops.h"
#include "engine/error.h"

#ifdef KVSCOPE_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace kvscope {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool is_gpu() const override { return false; }
  void walk_blocks(const WalkBatch& b) override { cpu_walk_blocks(b); }
  void attention_errors(const ErrorBatch& b) override { cpu_attention_errors(b); }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    return cpu_tsne_gradient(in, grad);
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return cpu_kcenter(x, n, d, k, first);
  }
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend cpu;
  return cpu;
}

bool cuda_available(std::string* why) {
#ifdef KVSCOPE_HAVE_CUDA
  return cuda_backend_instance(why) != nullptr;
#else
  if (why) *why = "built without CUDA (nvcc was not found at configure time)";
  return false;
#endif
}

Backend& select_backend(const std::string& which) {
  if (which == "cpu") return cpu_backend();
  if (which != "cuda" && which != "auto")
    throw SettingError("backend", "--backend", "'" + which + "' is not one of cpu, cuda, auto");
#ifdef KVSCOPE_HAVE_CUDA
  std::string why;
  if (Backend* gpu = cuda_backend_instance(&why)) return *gpu;
  if (which == "cuda") throw SettingError("backend", "--backend", "cuda: no CUDA device: " + why);
#else
  if (which == "cuda")
    throw SettingError(
        "backend", "--backend",
        "cuda: no CUDA kernels in this build (nvcc was not found at configure time)");
#endif
  return cpu_backend();
}

}  // namespace kvscope
