// Megatron's --pipeline-model-parallel-layout: parsing and the placement rules.
#include "train/pipeline_layout.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace gale {

namespace {

constexpr const char* kFlag = "--pipeline-model-parallel-layout";
constexpr int64_t kMaxExpanded = 1 << 20;  // bounds what repeats may unroll to

// The count after "*" at text[*pos] (advanced past it).
StatusOr<int64_t> repeat_count(const std::string& text, size_t* pos) {
  size_t end = *pos;
  while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
  if (end == *pos || end - *pos > 7)
    return InvalidArgument(kFlag, " '", text, "': expected a count after '*' at position ", *pos, ", found '",
                           text.substr(*pos, 8), "'");
  const int64_t n = std::stoll(text.substr(*pos, end - *pos));
  *pos = end;
  return n;
}

StatusOr<std::string> repeated(const std::string& text, const std::string& unit, int64_t n) {
  if (static_cast<int64_t>(unit.size()) * n > kMaxExpanded)
    return InvalidArgument(kFlag, " '", text, "': the repeats unroll to more than ", kMaxExpanded, " symbols");
  std::string out;
  for (int64_t i = 0; i < n; ++i) out += unit;
  return out;
}

// Unrolls "(group)*n" and "x*n"; drops commas and spaces.
StatusOr<std::string> unroll(const std::string& text) {
  std::string out;
  for (size_t pos = 0; pos < text.size();) {
    const char c = text[pos];
    if (c == ',' || c == ' ') {
      ++pos;
      continue;
    }
    if (c == ')') return InvalidArgument(kFlag, " '", text, "': unmatched ')' at position ", pos);
    if (c == '*') return InvalidArgument(kFlag, " '", text, "': '*' at position ", pos, " repeats nothing");
    std::string unit(1, c);
    ++pos;
    if (c == '(') {
      const size_t close = text.find(')', pos);
      if (close == std::string::npos) return InvalidArgument(kFlag, " '", text, "': unmatched '(' at position ", pos - 1);
      const std::string inner = text.substr(pos, close - pos);
      if (inner.find('(') != std::string::npos)
        return InvalidArgument(kFlag, " '", text, "': nested parentheses are not supported (as Megatron)");
      pos = close + 1;
      if (pos >= text.size() || text[pos] != '*')
        return InvalidArgument(kFlag, " '", text, "': expected '*n' after the group '(", inner, ")'");
      StatusOr<std::string> unrolled = unroll(inner);  // its own x*n (Megatron unrolls groups first)
      if (!unrolled.ok()) return unrolled.status();
      unit = *unrolled;
    }
    if (pos < text.size() && text[pos] == '*') {
      ++pos;
      StatusOr<int64_t> n = repeat_count(text, &pos);
      if (!n.ok()) return n.status();
      StatusOr<std::string> r = repeated(text, unit, *n);
      if (!r.ok()) return r.status();
      unit = *r;
    }
    out += unit;
    if (static_cast<int64_t>(out.size()) > kMaxExpanded)
      return InvalidArgument(kFlag, " '", text, "': the repeats unroll to more than ", kMaxExpanded, " symbols");
  }
  return out;
}

}  // namespace

StatusOr<std::vector<std::string>> parse_pipeline_layout(const std::string& text) {
  StatusOr<std::string> flat = unroll(text);
  if (!flat.ok()) return flat.status();
  std::vector<std::string> stages(1);
  for (char c : *flat) {
    if (c == '|') {
      stages.emplace_back();
      continue;
    }
    if (c != 'E' && c != 't' && c != 'm' && c != 'L')
      return InvalidArgument(kFlag, " '", text, "': expected the layer symbols E (embedding), t (decoder layer), m "
                             "(MTP layer), L (loss) and '|' between stages, found '", std::string(1, c), "'");
    stages.back() += c;
  }
  return stages;
}

StatusOr<std::vector<std::vector<int64_t>>> pipeline_layout_layers(const std::string& text, int64_t pp,
                                                                   int64_t num_layers, int64_t mtp_layers) {
  StatusOr<std::vector<std::string>> parsed = parse_pipeline_layout(text);
  if (!parsed.ok()) return parsed.status();
  const std::vector<std::string>& stages = *parsed;
  const int64_t n = static_cast<int64_t>(stages.size());
  if (n % pp != 0)
    return InvalidArgument(kFlag, " '", text, "': expected a number of stages divisible by "
                           "--pipeline-model-parallel-size ", pp, ", found ", n);
  std::string all;
  for (const std::string& s : stages) all += s;
  const auto count = [&](char c) { return std::count(all.begin(), all.end(), c); };
  if (count('E') != 1 || stages.front().empty() || stages.front().front() != 'E')
    return InvalidArgument(kFlag, " '", text, "': expected E exactly once, as the first layer of the first stage, "
                           "found ", count('E'), " E", count('E') == 1 ? " elsewhere" : "");
  if (count('L') != 1 || stages.back().empty() || stages.back().back() != 'L')
    return InvalidArgument(kFlag, " '", text, "': expected L exactly once, as the last layer of the last stage, "
                           "found ", count('L'), " L", count('L') == 1 ? " elsewhere" : "");
  if (count('t') != num_layers)
    return InvalidArgument(kFlag, " '", text, "': expected --num-layers ", num_layers, " decoder layers (t), found ",
                           count('t'));
  if (count('m') != mtp_layers)
    return InvalidArgument(kFlag, " '", text, "': expected ", mtp_layers, " MTP layers (m, --mtp-num-layers), found ",
                           count('m'));
  if (mtp_layers > 0) {
    if (all.find('t', all.find('m')) != std::string::npos)
      return InvalidArgument(kFlag, " '", text, "': expected every MTP layer (m) after every decoder layer (t)");
    if (std::count(stages.back().begin(), stages.back().end(), 'm') != mtp_layers)
      return Unimplemented(kFlag, " '", text, "': MTP layers on a stage without the loss (Megatron's standalone "
                           "MTP) are not supported yet; Gale runs them beside the loss: put every m in the last stage");
  }
  const int64_t vpp = n / pp;
  std::vector<std::vector<int64_t>> layers(pp, std::vector<int64_t>(vpp, 0));
  for (int64_t k = 0; k < n; ++k)
    layers[k % pp][k / pp] = std::count(stages[k].begin(), stages[k].end(), 't');
  return layers;
}

}  // namespace gale
