// PLACEHOLDER until the kernels land: probes the device and reports none usable.
#include <cuda_runtime.h>

#include "kernels/cuda_backend.h"

namespace kvscope {

Backend* cuda_backend_instance(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "kernels not implemented yet";
  return nullptr;
}

}  // namespace kvscope
