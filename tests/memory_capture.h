// Test captures held in memory (no file): the protocol and the reference cache only need
// CaptureFile's interface. Header-only, for tests.
#pragma once

#include <memory>
#include <random>
#include <utility>

#include "engine/io/capture.h"

namespace kvscope::testing {

class MemoryCapture final : public CaptureFile {
 public:
  explicit MemoryCapture(CaptureData data) : data_(std::move(data)) {}
  const CaptureInfo& info() const override { return data_.info; }
  std::shared_ptr<const LayerData> layer(int L) override {
    return std::shared_ptr<const LayerData>(&data_.layers.at(L), [](const LayerData*) {});
  }
  long long resident_bytes() const override { return 0; }
  long long layers_loaded() const override { return 0; }
  void set_max_cached_layers(int) override {}

 private:
  CaptureData data_;
};

// A rows x cols matrix of draws from `dist`, row by row (the callers' streams of values depend on
// the one distribution object they pass, which keeps its spare draw between calls).
inline MatrixF normal_matrix(std::mt19937& rng, std::normal_distribution<float>& dist, int rows,
                             int cols) {
  MatrixF m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = dist(rng);
  return m;
}

}  // namespace kvscope::testing
