// Reading Megatron's training log line in CLI tests: the values printed after "| <key>: ".
#pragma once

#include <regex>
#include <string>
#include <vector>

namespace gale::testing {

// The first group of every match of the regular expression `pattern` in `output`, as numbers.
inline std::vector<double> regex_values(const std::string& output, const std::string& pattern) {
  std::vector<double> out;
  std::regex re(pattern);
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it) out.push_back(std::stod((*it)[1]));
  return out;
}

// Every "| <key>: <number> |" field of `output`, in order (e.g. key "lm loss": one per logged iteration).
inline std::vector<double> logged_values(const std::string& output, const std::string& key) {
  return regex_values(output, "\\| " + key + ": +([0-9.E+-]+) \\|");  // counts are right-aligned
}

}  // namespace gale::testing
