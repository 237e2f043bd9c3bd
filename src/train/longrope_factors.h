// LongRoPE factor lists as flag text: the shortest decimal of each double, so text -> double -> text round-trips.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gale {

// {1.0, 1.0199999809265137} -> "1.0,1.0199999809265137" (nlohmann's shortest round-trip form, as Python's
// json writes floats), the form --long-factor / --short-factor read back to the same doubles.
inline std::string longrope_factor_text(const std::vector<double>& factors) {
  std::string out;
  for (size_t i = 0; i < factors.size(); ++i) out += (i ? "," : "") + nlohmann::json(factors[i]).dump();
  return out;
}

}  // namespace gale
