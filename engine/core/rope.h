// How a capture's keys and queries were rotated (RoPE), so that methods that need pre-RoPE
// vectors (Expected Attention, Compactor's leverage) can undo it. Token t sits at position t.
// The capture metadata `rope_theta` / `rope_layout` say it (docs/capture-format.md); captures
// made before those keys existed get them from what made them (engine/io/capture.cpp).
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace kvscope {

struct RopeInfo {
  // Interleaved: channels (2i, 2i+1) rotate together (llama2.c's run.c, engine/model/llama2c.cpp).
  // Half: channels (i, i + d/2) rotate together (Hugging Face's rotate_half,
  // engine/model/synth.cpp).
  enum class Layout { Unknown, Interleaved, Half };
  Layout layout = Layout::Unknown;
  double theta = 0;     // pair i turns by position * theta^(-2i/d); 0 when unknown
  std::string missing;  // why it is unknown (empty when known)

  bool known() const { return layout != Layout::Unknown && theta > 0; }
};

const char* rope_layout_name(RopeInfo::Layout l);  // "interleaved" | "half" | "unknown"

// The two channels of rotation pair i (0 <= i < d/2) in `layout`.
inline int rope_first(RopeInfo::Layout layout, int /*d*/, int i) {
  return layout == RopeInfo::Layout::Interleaved ? 2 * i : i;
}
inline int rope_second(RopeInfo::Layout layout, int d, int i) {
  return layout == RopeInfo::Layout::Interleaved ? 2 * i + 1 : i + d / 2;
}

// Rows [begin, end) of `x` rotated back to before RoPE, in double: x_pre = R(p)^T x with p the
// row's position ((*positions)[t] when given, else t), the angles p * theta^(-2i/d) in double.
// Returns (end - begin) x d. Requires rope.known() and an even d.
MatrixD unrotate_rows(const MatrixF& x, int begin, int end, const RopeInfo& rope,
                      const std::vector<int>* positions = nullptr);

}  // namespace kvscope
