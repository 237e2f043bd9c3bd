// Reading the flat YAML subset of MindSpeed's configuration files.
#include "train/flat_yaml.h"

#include <fstream>
#include <sstream>

namespace gale {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

std::string unquote(std::string v) {
  v = trim(v);
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
  return v;
}

// A `#` that starts a comment: at the line's start or after a blank, outside quotes.
std::string strip_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

}  // namespace

StatusOr<FlatYaml> parse_flat_yaml(const std::string& text, const std::string& where) {
  FlatYaml y;
  std::string last_key;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string raw; std::getline(in, raw);) {
    ++line_no;
    const std::string line = strip_comment(raw);
    const std::string t = trim(line);
    if (t.empty()) continue;
    if (t[0] == '-') {
      if (last_key.empty() || !y.scalars[last_key].empty())
        return InvalidArgument(where, "line ", line_no, ": a list item '", t, "' outside a list key");
      y.lists[last_key].push_back(unquote(t.substr(1)));
      continue;
    }
    const size_t colon = t.find(':');
    if (colon == std::string::npos || line[0] == ' ' || line[0] == '\t')
      return InvalidArgument(where, "line ", line_no, ": expected 'key: value', found '", t, "'");
    last_key = trim(t.substr(0, colon));
    if (y.scalars.count(last_key)) return InvalidArgument(where, "key ", last_key, " given twice");
    y.scalars[last_key] = unquote(t.substr(colon + 1));
    y.keys.push_back(last_key);
  }
  return y;
}

StatusOr<std::string> read_text_file(const std::string& path, const std::string& where) {
  std::ifstream f(path);
  if (!f.good()) return NotFound(where, "cannot read the file");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool parse_yaml_bool(const std::string& v, bool* out) {
  for (const char* s : {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"})
    if (v == s) return *out = true, true;
  for (const char* s : {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"})
    if (v == s) return *out = false, true;
  return false;
}

bool parse_yaml_int(const std::string& v, int64_t* out) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used != v.size()) return false;
    *out = x;
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace gale
