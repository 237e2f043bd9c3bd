// Checkpoint checks shared by the multi-rank resharding tests (reshard, unaligned linear).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "ckpt/checkpoint_reader.h"
#include "train/engine.h"

namespace gale::testing {

// Every parameter this rank holds equals, bit for bit, the checkpoint's tensor of that name.
inline void expect_params_equal_checkpoint(const Engine& engine, const std::string& dir) {
  StatusOr<CheckpointReader> reader = CheckpointReader::open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  for (const auto& chunk : engine.chunks) {
    const ParamBuffer& pb = chunk->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      StatusOr<Tensor> saved = reader->read(s.whole_model_name(), s.global_shape);
      ASSERT_TRUE(saved.ok()) << saved.status().to_string();
      int64_t differ = 0;
      for (int64_t i = 0; i < s.local_numel(); ++i)
        differ += pb.param_data(id)[i] != saved->data<float>()[s.global_index(i)];
      EXPECT_EQ(differ, 0) << s.name;
    }
  }
}

}  // namespace gale::testing
