// The dataset lists of --data-path / --data-args-path and of the per-split flags (Megatron's
// get_blend_and_blend_per_split), for the GPT and the SFT datasets alike.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

// One split's list ("[w1] p1 [w2] p2 ..." entries) and the flag it came from (for errors).
struct DataPathList {
  std::vector<std::string> entries;
  const char* flag = "";
};

// --data-path's entries, or with --data-args-path the whitespace-separated words of that file
// (Megatron: f.read().split()). A file that cannot be read is an error naming the flag.
StatusOr<DataPathList> data_path_list(const DataArgs& d);

// The train / valid / test lists of --train-data-path / --valid-data-path / --test-data-path, or
// with --per-split-data-args-path those of that file's JSON object: keys "train", "valid" and
// "test", each a string (split on whitespace) or a list; a key absent or null leaves its split
// empty. A file that is not such an object is an error naming the flag.
StatusOr<std::array<DataPathList, 3>> per_split_data_path_lists(const DataArgs& d);

}  // namespace gale
