// The dataset lists behind the --data-path family of flags (see the header).
#include "train/data_paths.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gale {

namespace {

StatusOr<std::string> read_text_file(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return NotFound(flag, " ", path, ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split_whitespace(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

}  // namespace

StatusOr<DataPathList> data_path_list(const DataArgs& d) {
  if (d.data_args_path.empty()) return DataPathList{d.data_path, "--data-path"};
  GALE_ASSIGN_OR_RETURN(std::string text, read_text_file(d.data_args_path, "--data-args-path"));
  return DataPathList{split_whitespace(text), "--data-args-path"};
}

StatusOr<std::array<DataPathList, 3>> per_split_data_path_lists(const DataArgs& d) {
  std::array<DataPathList, 3> out = {DataPathList{d.train_data_path, "--train-data-path"},
                                     DataPathList{d.valid_data_path, "--valid-data-path"},
                                     DataPathList{d.test_data_path, "--test-data-path"}};
  if (d.per_split_data_args_path.empty()) return out;
  const char* flag = "--per-split-data-args-path";
  GALE_ASSIGN_OR_RETURN(std::string text, read_text_file(d.per_split_data_args_path, flag));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(flag, " ", d.per_split_data_args_path, ": expected a JSON object with train/valid/test");
  const char* keys[3] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i) {
    if (!j.contains(keys[i]) || j[keys[i]].is_null()) continue;
    out[i].flag = flag;
    if (j[keys[i]].is_string()) {
      out[i].entries = split_whitespace(j[keys[i]].get<std::string>());
    } else if (j[keys[i]].is_array()) {
      for (const auto& e : j[keys[i]]) out[i].entries.push_back(e.is_string() ? e.get<std::string>() : e.dump());
    } else {
      return InvalidArgument(flag, ": '", keys[i], "' must be a string or a list");
    }
  }
  return out;
}

}  // namespace gale
