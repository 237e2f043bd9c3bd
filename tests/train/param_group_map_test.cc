// --dump-param-to-param-group-map (train/param_group_map.h): Megatron's numbering of param groups (None first, then
// the override tuples in Python's order; dense groups before expert-parallel ones, whichever rank holds them), the
// DCP directory written and read back by Gale's reader, and the names of the tied output copy and grouped experts.
#include "train/param_group_map.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "ckpt/dcp_reader.h"

namespace gale {
namespace {

namespace fs = std::filesystem;

ParamGroupKey key(std::vector<std::pair<std::string, double>> o, bool expert = false) {
  ParamGroupKey k;
  k.overrides = std::move(o);
  k.expert_parallel = expert;
  return k;
}

TEST(ParamGroupMap, MegatronsGroupOrder) {
  const ParamGroupKey none = key({}), wd = key({{"wd_mult", 0.0}}), dlr = key({{"max_lr", 0.5}}),
                      dlr_min = key({{"max_lr", 0.5}, {"min_lr", 0.05}}),
                      dlr_wd = key({{"max_lr", 0.5}, {"wd_mult", 0.0}}), expert = key({}, true),
                      expert_wd = key({{"wd_mult", 0.0}}, true);
  // Given in an order unlike the result, experts first (as a rank holding only experts would list them).
  const ParamGroupMap m = assign_param_groups({{"e.b", expert_wd},
                                               {"e.w", expert},
                                               {"norm", wd},
                                               {"emb_bias", dlr_wd},
                                               {"w", none},
                                               {"emb", dlr_min},
                                               {"out", dlr},
                                               {"w2", none}});
  // sorted(keys, key=lambda x: (x[0] is not None, x[0])): None; ('max_lr',) < ('max_lr','min_lr') <
  // ('max_lr','wd_mult') < ('wd_mult',); then the expert groups: None, ('wd_mult',).
  EXPECT_EQ(m.at("w"), 0);
  EXPECT_EQ(m.at("w2"), 0);
  EXPECT_EQ(m.at("out"), 1);
  EXPECT_EQ(m.at("emb"), 2);
  EXPECT_EQ(m.at("emb_bias"), 3);
  EXPECT_EQ(m.at("norm"), 4);
  EXPECT_EQ(m.at("e.w"), 5);
  EXPECT_EQ(m.at("e.b"), 6);
  EXPECT_TRUE(param_group_key_less(none, wd));
  EXPECT_FALSE(param_group_key_less(wd, none));
  EXPECT_TRUE(param_group_key_less(key({{"max_lr", 0.1}}), key({{"max_lr", 0.2}})));  // values compare too
}

TEST(ParamGroupMap, WrittenAsDcpAndReadBack) {
  const fs::path dir = fs::temp_directory_path() / ("gale_pgmap_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const ParamGroupMap m = {{"module.module.embedding.word_embeddings.weight", 1},
                           {"module.module.decoder.layers.0.input_layernorm.weight", 2},
                           {"module.module.decoder.layers.1.self_attention.linear_qkv.weight", 0}};
  ASSERT_TRUE(write_param_group_map(dir.string(), m).ok());
  EXPECT_TRUE(fs::exists(dir / ".metadata"));
  EXPECT_TRUE(fs::exists(dir / "__0_0.distcp"));
  StatusOr<DcpCheckpoint> c = DcpCheckpoint::open(dir.string());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->tensors().empty());
  EXPECT_EQ(c->objects().size(), 3u);  // one BytesStorageMetadata per key
  StatusOr<ParamGroupMap> back = read_param_group_map(dir.string());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, m);
  // Not a map: a directory without .metadata.
  fs::remove(dir / ".metadata");
  EXPECT_FALSE(read_param_group_map(dir.string()).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gale
