// MindSpeed-LLM's --use-glm-rope (its ChatGLM3 / GLM-4 scripts pass it with --rotary-percent 0.5): GLM's RoPE,
// interleaved pairs over the rotated part of each head, which is Megatron's --rotary-interleaved.
#include <gtest/gtest.h>

#include "model/config.h"
#include "pretrain_cli.h"
#include "train/arguments.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing::PretrainCli;

ModelConfig config_of(const std::vector<std::string>& extra) {
  PretrainCli c;
  const Status st = c.parse_minimal(extra);
  EXPECT_TRUE(st.ok()) << st.message();
  c.args.model.padded_vocab_size = 128;
  return model_config_from_args(c.args);
}

TEST(GlmRopeArguments, UseGlmRopeIsRotaryInterleaved) {
  const ModelConfig glm = config_of({"--position-embedding-type", "rope", "--use-glm-rope", "--rotary-percent", "0.5"});
  const ModelConfig megatron =
      config_of({"--position-embedding-type", "rope", "--rotary-interleaved", "--rotary-percent", "0.5"});
  EXPECT_TRUE(glm.rope_interleaved);
  EXPECT_EQ(glm.rotary_percent, 0.5);
  EXPECT_EQ(glm.rope_interleaved, megatron.rope_interleaved);
  EXPECT_FALSE(config_of({"--position-embedding-type", "rope", "--rotary-percent", "0.5"}).rope_interleaved);
}

}  // namespace
}  // namespace gale
