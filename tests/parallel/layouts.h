// Parallel layouts for the multi-rank tests: a name, the world size it needs and its flags, and
// the name lookup and test-name helpers the parameterised suites share.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "model/config.h"

namespace gale::testing {

struct Layout {
  const char* name;
  int world;
  std::vector<std::string> flags;
  int64_t bucket_size = 0;  // EngineOptions::ddp_bucket_size (0: Megatron's rule)
  RecomputePlan recompute = {};  // EngineOptions::recompute (what --recompute-* install)
  bool flash_attention = false;  // the fused (flash) attention kernel instead of the reference, here and in the reference run
};

inline std::vector<std::string> layout_names(const std::vector<Layout>& layouts) {
  std::vector<std::string> names;
  for (const Layout& l : layouts) names.push_back(l.name);
  return names;
}

// The layout called `name`, or null.
inline const Layout* find_layout(const std::vector<Layout>& layouts, const std::string& name) {
  for (const Layout& l : layouts)
    if (name == l.name) return &l;
  return nullptr;
}

// "<layout>_gpt" / "<layout>_llama" for suites parameterised by (layout name, llama).
inline std::string layout_model_test_name(const ::testing::TestParamInfo<std::tuple<std::string, bool>>& info) {
  return std::get<0>(info.param) + (std::get<1>(info.param) ? "_llama" : "_gpt");
}

}  // namespace gale::testing
