// The real captures in sample_data/ (see sample_data/README.md): tests that run on real data run
// on every one of them, so both models' heads are covered (stories260K: head dim 8;
// kjv3M: head dim 64).
#pragma once

#include <string>
#include <vector>

namespace kvscope::testing {

inline std::vector<std::string> sample_capture_names() {
  return {"stories260K_lily.safetensors", "stories260K_dragon.safetensors",
          "kjv3M_beginning.safetensors"};
}

inline std::vector<std::string> sample_capture_paths() {
  std::vector<std::string> paths;
  for (const std::string& name : sample_capture_names())
    paths.push_back(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/" + name);
  return paths;
}

}  // namespace kvscope::testing
