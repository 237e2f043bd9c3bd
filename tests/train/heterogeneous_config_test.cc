// --heterogeneous-layers-config-*: the block_configs JSON read as Megatron does, and every malformed
// or unsupported entry refused with the layer index and field named.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/temp_dir.h"
#include "train/arg_parser.h"
#include "train/arguments.h"
#include "train/heterogeneous_config.h"

namespace gale {
namespace {

const HeteroModelShape kShape{2, 64, 8, 4, 160};  // 2 layers, H 64, 8 heads in 4 groups, FFN 160

std::string blocks(const std::string& first, const std::string& second = R"({"attention": {}, "ffn": {}})") {
  return R"({"block_configs": [)" + first + ", " + second + "]}";
}

std::string error(const std::string& json) {
  StatusOr<std::vector<HeteroLayer>> r = parse_heterogeneous_layers(json, kShape, "--flag");
  return r.ok() ? "ok" : r.status().message();
}

TEST(HeterogeneousConfig, ReadsMegatronFields) {
  StatusOr<std::vector<HeteroLayer>> r = parse_heterogeneous_layers(
      blocks(R"({"attention": {"n_heads_in_group": 8, "no_op": false, "replace_with_linear": false},
                 "ffn": {"ffn_mult": 2.625, "no_op": false, "replace_with_linear": false}})",
             R"({"attention": {"n_heads_in_group": null, "no_op": true}, "mlp": {"replace_with_linear": true}})"),
      kShape, "--flag");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const std::vector<HeteroLayer>& l = r.value();
  EXPECT_EQ(l[0].attention, SubBlock::kBlock);
  EXPECT_EQ(l[0].kv_heads, 1);  // 8 heads / 8 per group
  EXPECT_EQ(l[0].ffn, 256);     // int(2 * 2.625 * 64 / 3) = 112 -> the multiple of 256 above
  EXPECT_EQ(l[1].attention, SubBlock::kNoOp);
  EXPECT_EQ(l[1].mlp, SubBlock::kLinear);
  // Defaults: the model's groups and FFN; num_query_groups / ffn_hidden_size taken as they are.
  r = parse_heterogeneous_layers(blocks(R"({"attention": {"num_query_groups": 2}, "ffn": {"ffn_hidden_size": 96}})"),
                                 kShape, "--flag");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r.value()[0].kv_heads, 2);
  EXPECT_EQ(r.value()[0].ffn, 96);
  EXPECT_EQ(r.value()[1].kv_heads, 4);
  EXPECT_EQ(r.value()[1].ffn, 160);
  // ffn_mult exactly on a multiple: 2 * 6 * 64 / 3 = 256.
  r = parse_heterogeneous_layers(blocks(R"({"attention": {}, "ffn": {"ffn_mult": 6}})"), kShape, "--flag");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value()[0].ffn, 256);
}

TEST(HeterogeneousConfig, MalformedEntriesNameLayerAndField) {
  EXPECT_EQ(error("{"), "--flag: not valid JSON");
  EXPECT_EQ(error("{}"), "--flag: expected a \"block_configs\" list (one entry per layer)");
  EXPECT_EQ(error(R"({"block_configs": [{"attention": {}, "ffn": {}}]})"),
            "--flag: block_configs has 1 entries, expected one per layer (--num-layers 2)");
  EXPECT_EQ(error(R"({"num_hidden_layers": 3, "block_configs": []})"),
            "--flag: num_hidden_layers is 3 but --num-layers is 2 (expected the same)");
  EXPECT_EQ(error(R"({"hidden_size": 32, "block_configs": []})"),
            "--flag: hidden_size is 32 but --hidden-size is 64 (expected the same)");
  EXPECT_EQ(error(blocks(R"({"ffn": {}})")), "--flag: block_configs[0].attention: missing");
  EXPECT_EQ(error(blocks(R"({"attention": {}, "ffn": {}})", R"({"attention": {}})")),
            "--flag: block_configs[1].ffn: missing");
  EXPECT_EQ(error(blocks(R"({"attention": {"no_op": true, "replace_with_linear": true}, "ffn": {}})")),
            "--flag: block_configs[0].attention: no_op and replace_with_linear are both true (expected at most one)");
  EXPECT_EQ(error(blocks(R"({"attention": {"no_op": "yes"}, "ffn": {}})")),
            "--flag: block_configs[0].attention.no_op: expected true or false, found \"yes\"");
  EXPECT_EQ(error(blocks(R"({"attention": {"n_heads_in_group": 3}, "ffn": {}})")),
            "--flag: block_configs[0].attention.n_heads_in_group: --num-attention-heads 8 must be a multiple of "
            "n_heads_in_group 3");
  EXPECT_EQ(error(blocks(R"({"attention": {"n_heads_in_group": 0}, "ffn": {}})")),
            "--flag: block_configs[0].attention.n_heads_in_group: expected a positive integer or null, found 0");
  EXPECT_EQ(error(blocks(R"({"attention": {"num_query_groups": 3}, "ffn": {}})")),
            "--flag: block_configs[0].attention.num_query_groups: 3 must divide --num-attention-heads 8");
  EXPECT_EQ(error(blocks(R"({"attention": {}, "ffn": {}})", R"({"attention": {"no_op": true, "n_heads_in_group": 2}, "ffn": {}})")),
            "--flag: block_configs[1].attention.n_heads_in_group: a query-group count for a no_op attention "
            "(expected null)");
  EXPECT_EQ(error(blocks(R"({"attention": {}, "ffn": {"replace_with_linear": true, "ffn_mult": 1.0}})")),
            "--flag: block_configs[0].ffn.ffn_mult: an FFN size for a replace_with_linear MLP (expected null)");
  EXPECT_EQ(error(blocks(R"({"attention": {}, "ffn": {"ffn_mult": -1}})")),
            "--flag: block_configs[0].ffn.ffn_mult: expected a positive number or null, found -1");
  EXPECT_EQ(error(blocks(R"({"attention": {"window_length": 4096}, "ffn": {}})")),
            "--flag: block_configs[0].attention.window_length: not supported yet (expected null or false, found 4096)");
  EXPECT_EQ(error(blocks(R"({"attention": {}, "ffn": {}})", R"({"attention": {}, "ffn": {"sparsify": ["x"]}})")),
            "--flag: block_configs[1].ffn.sparsify: not supported yet (expected null or false, found [\"x\"])");
}

// The flags end to end: the path read into the encoded JSON, the TP split checked per layer, and
// combinations not supported yet refused.
struct Validated {
  Status status;
  Arguments args;
};
Validated validate(std::vector<std::string> extra) {
  std::vector<std::string> words = {"gale", "--mock-data", "--num-layers", "2", "--hidden-size", "64",
                                    "--num-attention-heads", "8", "--seq-length", "32", "--max-position-embeddings",
                                    "32", "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3",
                                    "--group-query-attention", "--num-query-groups", "4", "--ffn-hidden-size", "160"};
  words.insert(words.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  Validated v;
  ArgParser p("gale pretrain", "test");
  add_all_pretrain_args(p, v.args);
  Status parsed = p.parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(parsed.ok()) << parsed.to_string();
  const int64_t world = 2;
  v.status = validate_all_pretrain_args(v.args, p, world);
  return v;
}

TEST(HeterogeneousConfig, FlagsValidateAgainstTheLayout) {
  const std::string two_groups = blocks(R"({"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_hidden_size": 96}})");
  Validated ok = validate({"--heterogeneous-layers-config-encoded-json", two_groups, "--tensor-model-parallel-size", "2"});
  EXPECT_TRUE(ok.status.ok()) << ok.status.to_string();

  testing_util::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  std::ofstream(path) << two_groups;
  Validated from_path = validate({"--heterogeneous-layers-config-path", path});
  ASSERT_TRUE(from_path.status.ok()) << from_path.status.to_string();
  EXPECT_EQ(from_path.args.model.heterogeneous_layers_config_encoded_json, two_groups);  // kept for checkpoints
  EXPECT_EQ(validate({"--heterogeneous-layers-config-path", dir.path() + "/missing.json"}).status.message(),
            "--heterogeneous-layers-config-path " + dir.path() + "/missing.json: cannot read the file");

  const std::string one_group = blocks(R"({"attention": {}, "ffn": {}})", R"({"attention": {"n_heads_in_group": 8}, "ffn": {}})");
  EXPECT_EQ(validate({"--heterogeneous-layers-config-encoded-json", one_group, "--tensor-model-parallel-size", "2"})
                .status.message(),
            "--heterogeneous-layers-config-encoded-json: block_configs[1].attention: the layer's 1 query groups must "
            "be divisible by --tensor-model-parallel-size 2");
  const std::string odd_ffn = blocks(R"({"attention": {}, "ffn": {"ffn_hidden_size": 99}})");
  EXPECT_EQ(validate({"--heterogeneous-layers-config-encoded-json", odd_ffn, "--tensor-model-parallel-size", "2"})
                .status.message(),
            "--heterogeneous-layers-config-encoded-json: block_configs[0].ffn: the layer's FFN size 99 must be "
            "divisible by --tensor-model-parallel-size 2");
  // --unaligned-linear: uneven splits in whole groups (tests/parallel/heterogeneous_invariance_mpi_test.cc),
  // at least one group and one FFN column per rank.
  Validated uneven = validate({"--heterogeneous-layers-config-encoded-json", odd_ffn, "--tensor-model-parallel-size",
                               "2", "--unaligned-linear"});
  EXPECT_TRUE(uneven.status.ok()) << uneven.status.to_string();
  EXPECT_EQ(validate({"--heterogeneous-layers-config-encoded-json", one_group, "--tensor-model-parallel-size", "2",
                      "--unaligned-linear"})
                .status.message(),
            "--heterogeneous-layers-config-encoded-json: block_configs[1].attention: --unaligned-linear keeps every "
            "query group whole on one rank: the layer's 1 query groups must be at least --tensor-model-parallel-size 2");
  EXPECT_EQ(validate({"--heterogeneous-layers-config-encoded-json", two_groups, "--unaligned-linear",
                      "--context-parallel-size", "2", "--cp-comm-type", "a2a"})
                .status.message(),
            "--heterogeneous-layers-config-encoded-json with --unaligned-linear and a Ulysses head split of context "
            "parallelism: not supported yet (each layer's uneven heads per TP rank would need their own check)");
  for (const char* comm : {"p2p", "allgather", "a2a"}) {  // context parallelism: ring, all-gather, Ulysses
    Validated cp = validate({"--heterogeneous-layers-config-encoded-json", two_groups, "--context-parallel-size", "2",
                             "--cp-comm-type", comm});
    EXPECT_TRUE(cp.status.ok()) << comm << ": " << cp.status.to_string();
  }
  // --use-ulysses-allgather-kv: one key/value head per TP rank in every attention layer.
  EXPECT_EQ(validate({"--heterogeneous-layers-config-encoded-json", two_groups, "--num-query-groups", "1",
                      "--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo",
                      "--use-ulysses-allgather-kv"})
                .status.message(),
            "--heterogeneous-layers-config-encoded-json: block_configs[0].attention: --use-ulysses-allgather-kv "
            "all-gathers one key/value head per TP rank: expected 1 query groups, found 2");
  Validated selective = validate({"--heterogeneous-layers-config-encoded-json", two_groups, "--recompute-granularity",
                                  "selective", "--recompute-modules", "core_attn", "layernorm", "mlp"});
  EXPECT_TRUE(selective.status.ok()) << selective.status.to_string();  // tests/train/heterogeneous_recompute_test.cc
  // --experimental-attention-variant gdn: per-layer query groups and FFN sizes
  // (tests/parallel/heterogeneous_gdn_invariance_mpi_test.cc), but Megatron's experimental-attention
  // block spec has no no_op or linear sub-blocks.
  const std::vector<std::string> gdn = {"--experimental-attention-variant", "gdn", "--linear-attention-freq", "2",
                                        "--normalization", "RMSNorm", "--swiglu"};
  std::vector<std::string> groups_gdn = {"--heterogeneous-layers-config-encoded-json", two_groups};
  groups_gdn.insert(groups_gdn.end(), gdn.begin(), gdn.end());
  Validated gdn_ok = validate(groups_gdn);
  EXPECT_TRUE(gdn_ok.status.ok()) << gdn_ok.status.to_string();
  const std::string noop_attention =
      blocks(R"({"attention": {"no_op": true}, "ffn": {}})", R"({"attention": {}, "ffn": {}})");
  std::vector<std::string> noop_gdn = {"--heterogeneous-layers-config-encoded-json", noop_attention};
  noop_gdn.insert(noop_gdn.end(), gdn.begin(), gdn.end());
  EXPECT_EQ(validate(noop_gdn).status.message(),
            "--heterogeneous-layers-config-encoded-json: block_configs[0]: with --experimental-attention-variant gdn "
            "Megatron builds its experimental-attention block spec instead of the heterogeneous one, which has no "
            "no_op or replace_with_linear sub-blocks: expected only per-layer query groups and FFN sizes, found a "
            "attention that is no_op");
  // MoE: per-layer query groups and FFN sizes (tests/parallel/heterogeneous_invariance_mpi_test.cc), but
  // Megatron's MoE block spec has no no_op or linear sub-blocks.
  Validated groups_moe = validate({"--heterogeneous-layers-config-encoded-json", two_groups, "--num-experts", "4",
                                   "--moe-router-topk", "2"});
  EXPECT_TRUE(groups_moe.status.ok()) << groups_moe.status.to_string();
  const std::string linear = blocks(R"({"attention": {}, "ffn": {}})", R"({"attention": {}, "ffn": {"replace_with_linear": true}})");
  EXPECT_EQ(validate({"--heterogeneous-layers-config-encoded-json", linear, "--num-experts", "4", "--moe-router-topk",
                      "2"})
                .status.message(),
            "--heterogeneous-layers-config-encoded-json: block_configs[1]: with --num-experts Megatron builds its MoE "
            "decoder block spec instead of the heterogeneous one, which has no no_op or replace_with_linear "
            "sub-blocks: expected only per-layer query groups and FFN sizes, found a ffn that is replace_with_linear");
}

// The heterogeneous checks alone (validate_heterogeneous_args) on flags the full validation would
// stop earlier for: Megatron's own refusals.
TEST(HeterogeneousConfig, RefusedAsMegatronRefuses) {
  const auto check = [](const std::function<void(ModelArgs&)>& set) {
    Arguments a;
    ModelArgs& m = a.model;
    m.num_layers = 2;
    m.hidden_size = 64;
    m.num_attention_heads = 8;
    m.num_kv_heads = 4;
    m.ffn_hidden_size = 160;
    m.heterogeneous_layers_config_encoded_json = blocks(R"({"attention": {}, "ffn": {}})");
    set(m);
    ArgParser p("gale pretrain", "test");
    return validate_heterogeneous_args(a, p).message();
  };
  EXPECT_EQ(check([](ModelArgs& m) { m.multi_latent_attention = true; }),
            "--heterogeneous-layers-config-encoded-json with --multi-latent-attention: Megatron asserts \"Multi "
            "latent attention with heterogeneous layers is not supported.\"");
  EXPECT_EQ(check([](ModelArgs& m) { m.is_hybrid_model = true; }),
            "--heterogeneous-layers-config-encoded-json with --is-hybrid-model: Megatron's hybrid (Mamba) model builds "
            "its layers from --hybrid-layer-pattern and never reads block_configs");
  EXPECT_EQ(check([](ModelArgs&) {}), "");
}

}  // namespace
}  // namespace gale
