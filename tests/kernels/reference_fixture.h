// What the codec tests share: their numpy fixtures (tests/data/reference/<name>, written by
// tools/reference/) and f32 bit patterns.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/check.h"

namespace gale::testing {

// tests/data/reference/<relative>, parsed (a missing file aborts naming it).
inline nlohmann::json load_reference_json(const std::string& relative) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/" + relative);
  GALE_CHECK(in.good()) << "missing tests/data/reference/" << relative;
  return nlohmann::json::parse(in);
}

inline float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

inline uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace gale::testing
