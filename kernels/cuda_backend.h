// The CUDA implementation of the engine's Backend seam. Plain C++ header: no CUDA types.
#pragma once

#include <string>

#include "engine/backend.h"

namespace kvscope {

// The process-wide CUDA backend, or nullptr when no device answers (`why` says why).
Backend* cuda_backend_instance(std::string* why);

}  // namespace kvscope
