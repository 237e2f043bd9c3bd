// The flag-inventory tests (Megatron's pretrain_gpt.py parser, MindSpeed's feature inventory): a
// committed list of flags, `gale pretrain`'s whole parser, and the check that none is unknown.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "features/registry.h"
#include "train/arguments_fake_process_group.h"
#include "pretrain_cli.h"

namespace gale::testing {

// The non-empty lines of tests/data/<relative_path>, less `#` comment lines (a list's header).
inline std::vector<std::string> read_flag_list(const std::string& relative_path) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/" + relative_path);
  std::vector<std::string> flags;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') flags.push_back(line);
  return flags;
}

// `gale pretrain`'s parser: the pretrain flags, the features' own (MindSpeed's) flags and
// --fake-process-group (train/arguments_fake_process_group.h).
struct FullCli : PretrainCli {
  std::unique_ptr<FeatureRegistry> registry = make_feature_registry();
  FakeProcessGroupArgs fake;
  FullCli() {  // in gale pretrain's order
    add_fake_process_group_args(parser, fake);
    registry->register_args(parser);
  }
};

// Each flag alone after the minimal command line runs, or fails with one line that is not
// "unknown flag" (accepted with a note, refused with its reason, or a missing value).
inline void expect_none_unknown(const std::vector<std::string>& flags) {
  for (const std::string& flag : flags) {
    FullCli cli;
    const Status st = cli.parse_minimal({flag});
    if (st.ok()) continue;
    EXPECT_EQ(st.message().find("unknown flag"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
}

}  // namespace gale::testing
