// `gale pretrain --dump-param-to-param-group-map` end to end under mpirun: at PP 2 with --bf16 and --decoupled-lr /
// --decoupled-min-lr, and at EP 2 with grouped experts, the map rank 0 writes (read back with Gale's DCP reader)
// names every trainable parameter of both ranks as Megatron does and puts it in the group the optimizer gives it:
// the plain matrices in group 0, the decoupled-rate word embedding and output layer next, the weight-decay-free
// biases and norms after them, the expert-parallel matrices last.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli/mpi_cli.h"
#include "subprocess.h"
#include "train/param_group_map.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
using testing::kMpiEnv;
using testing::tiny_gpt_pretrain;

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("gale_pgmap_cli_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  return d;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
// Megatron's no-weight-decay rule, by name: biases and the (1-D) norm weights.
bool no_decay(const std::string& name) {
  return ends_with(name, ".bias") || ends_with(name, "_bias") || contains(name, "layernorm") ||
         contains(name, "layer_norm");
}

TEST(ParamGroupMapCli, PipelineStagesBf16DecoupledLr) {
  const fs::path dir = temp_dir("pp");
  test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(2, 1,
                        {"--pipeline-model-parallel-size", "2", "--bf16", "--decoupled-lr", "1e-3",
                         "--decoupled-min-lr", "1e-4", "--dump-param-to-param-group-map", dir.string()},
                        {}),
      kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote the parameter -> param-group map ("), std::string::npos) << r.output;
  StatusOr<ParamGroupMap> m = read_param_group_map(dir.string());
  ASSERT_TRUE(m.ok()) << m.status().message();
  // Both stages' layers, under Float16Module's and DDP's prefixes; the last stage's tied copy as output_layer.
  for (const char* name : {"module.module.embedding.word_embeddings.weight", "module.module.output_layer.weight",
                           "module.module.decoder.layers.0.self_attention.linear_proj.weight",
                           "module.module.decoder.layers.1.mlp.linear_fc2.weight",
                           "module.module.decoder.final_layernorm.weight"})
    EXPECT_EQ(m->count(name), 1u) << name;
  int per_group[3] = {0, 0, 0};
  for (const auto& [name, group] : *m) {
    ASSERT_EQ(name.rfind("module.module.", 0), 0u) << name;
    const bool decoupled = ends_with(name, "word_embeddings.weight") || ends_with(name, "output_layer.weight");
    // None < (('max_lr', 1e-3), ('min_lr', 1e-4)) < (('wd_mult', 0.0),)
    const int64_t want = decoupled ? 1 : no_decay(name) ? 2 : 0;
    EXPECT_EQ(group, want) << name;
    ASSERT_GE(group, 0);
    ASSERT_LT(group, 3);
    ++per_group[group];
  }
  EXPECT_EQ(per_group[1], 2);
  EXPECT_GT(per_group[0], 8);  // position embedding, and 4 matrices per layer
  EXPECT_GT(per_group[2], 8);
  fs::remove_all(dir);
}

TEST(ParamGroupMapCli, ExpertParallelGroupedExperts) {
  const fs::path dir = temp_dir("ep");
  test::RunResult r = test::run_with_timeout(
      tiny_gpt_pretrain(2, 1,
                        {"--num-experts", "4", "--expert-model-parallel-size", "2", "--moe-grouped-gemm",
                         "--disable-bias-linear", "--dump-param-to-param-group-map", dir.string()},
                        {}),
      kMpiEnv, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  StatusOr<ParamGroupMap> m = read_param_group_map(dir.string());
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (int layer = 0; layer < 2; ++layer)
    for (int e = 0; e < 4; ++e)  // global expert numbers, from both expert-parallel ranks
      for (const char* fc : {"linear_fc1", "linear_fc2"}) {
        const std::string name = "module.decoder.layers." + std::to_string(layer) + ".mlp.experts." + fc + ".weight" +
                                 std::to_string(e);
        ASSERT_EQ(m->count(name), 1u) << name;
        EXPECT_EQ(m->at(name), 2) << name;  // after the dense None and (('wd_mult', 0.0),) groups
      }
  for (const auto& [name, group] : *m) {
    ASSERT_EQ(name.rfind("module.decoder.", 0) == 0 || name.rfind("module.embedding.", 0) == 0, true) << name;
    if (contains(name, ".mlp.experts.")) continue;
    EXPECT_EQ(group, no_decay(name) ? 1 : 0) << name;
  }
  EXPECT_EQ(m->at("module.decoder.layers.0.mlp.router.weight"), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gale
