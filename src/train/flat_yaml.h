// The flat YAML subset of MindSpeed's configuration files (LayerZeRO's --layerzero-config, FSDP2's
// --fsdp2-config-path): one mapping of `key: value` lines and `key:` lines followed by `- item`
// lines (a list), `#` comments and blank lines; quotes around a value or item dropped.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct FlatYaml {
  std::vector<std::string> keys;                             // in file order, each once
  std::map<std::string, std::string> scalars;                // every key ("" for a list key)
  std::map<std::string, std::vector<std::string>> lists;     // the keys followed by `- item` lines
  // A key given as a list (`key: [a, b]` inline lists are not part of the subset) or as an empty value.
  bool is_list(const std::string& key) const { return lists.count(key) > 0; }
};

// Parses `text`; `where` prefixes every message (e.g. "--layerzero-config z.yaml: "). Errors name
// the line: a list item outside a list key, a line that is not `key: value`, a key given twice.
StatusOr<FlatYaml> parse_flat_yaml(const std::string& text, const std::string& where);

// The file's text, or NotFound "<where>cannot read the file".
StatusOr<std::string> read_text_file(const std::string& path, const std::string& where);

// YAML 1.1 booleans as PyYAML's safe_load reads them (true/True/TRUE/yes/on, false/...); other
// values are not booleans.
bool parse_yaml_bool(const std::string& v, bool* out);

// A whole-string integer; false for anything else.
bool parse_yaml_int(const std::string& v, int64_t* out);

}  // namespace gale
