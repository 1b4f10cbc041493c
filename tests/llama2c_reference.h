// run.c's encode written out the way run.c does it (rescanning every adjacent pair after each
// merge, O(n^2)), as the reference for llama2c::Tokenizer's heap-ordered merges. Shared by
// tests/test_llama2c.cpp and the differential fuzz target fuzz/fuzz_llama2c.cpp.
#pragma once

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/llama2c.h"

namespace kvscope::llama2c::reference {

// std::nullopt where run.c has no token to use (a byte without its <0xXX> piece, no " " piece
// for the dummy prefix); the tokenizer throws InputError there.
inline std::optional<std::vector<int>> run_c_encode(const Tokenizer& t, const std::string& text,
                                                    bool bos, bool dummy_prefix) {
  std::map<std::string, int> lookup;
  for (int i = t.vocab_size() - 1; i >= 0; --i) lookup[t.piece(i)] = i;  // lowest id wins
  auto find = [&](const std::string& s) {
    auto it = lookup.find(s);
    return it == lookup.end() ? -1 : it->second;
  };
  std::vector<int> tokens;
  if (bos) tokens.push_back(kBosToken);
  if (dummy_prefix && !text.empty()) {
    if (find(" ") < 0) return std::nullopt;
    tokens.push_back(find(" "));
  }
  std::string cp;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if ((ch & 0xC0) != 0x80) cp.clear();
    cp.push_back(static_cast<char>(ch));
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 &&
        cp.size() < 4)
      continue;
    if (find(cp) >= 0) {
      tokens.push_back(find(cp));
    } else {
      for (unsigned char b : cp) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "<0x%02X>", b);
        if (find(hex) < 0) return std::nullopt;
        tokens.push_back(find(hex));
      }
    }
    cp.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1, best_index = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int id = find(t.piece(tokens[i]) + t.piece(tokens[i + 1]));
      if (id >= 0 && t.score(id) > best_score) {
        best_score = t.score(id);
        best_id = id;
        best_index = static_cast<int>(i);
      }
    }
    if (best_index < 0) break;
    tokens[best_index] = best_id;
    tokens.erase(tokens.begin() + best_index + 1);
  }
  return tokens;
}

}  // namespace kvscope::llama2c::reference
