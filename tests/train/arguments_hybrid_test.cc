// The hybrid Mamba model's parallel layouts at the argument level: tensor, sequence and context
// parallelism accepted when the TP size divides the mixer's groups and CP the heads of a TP rank
// (and divides or is a multiple of its groups; Megatron's MambaMixer and MambaContextParallel
// asserts), refused in one line naming the flags otherwise; what the Mamba layers still lack stays refused.
// MoE layers ('E'): accepted with --num-experts, with expert, tensor and context parallelism, their flag
// errors in one line.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "pretrain_cli.h"
#include "train/engine.h"

namespace gale {
namespace {

using testing::FlagErrorCase;

// minimal_pretrain_flags' hidden 64: d_inner 128, 8 heads of 16, in `groups` groups.
std::vector<std::string> hybrid(const std::string& groups, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-override-pattern", "M*", "--mamba-head-dim", "16",
                                    "--mamba-num-groups", groups};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(HybridArguments, TensorAndSequenceParallelAccepted) {
  for (const auto& [groups, world, flags] :
       std::vector<std::tuple<std::string, int64_t, std::vector<std::string>>>{
           {"2", 2, {"--tensor-model-parallel-size", "2"}},
           {"2", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {"4", 8,
            {"--tensor-model-parallel-size", "4", "--sequence-parallel", "--pipeline-model-parallel-size", "2"}},
           {"8", 8, {"--tensor-model-parallel-size", "8", "--num-attention-heads", "8"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid(groups, flags), world);
    EXPECT_TRUE(s.ok()) << groups << " groups at world " << world << ": " << s.to_string();
  }
}

// 'E' layers with --num-experts: one process, EP 2 over the DP ranks, TP 2 with SP (MoE under TP needs it),
// CP 2 alone and with EP 2 over the cp ranks.
std::vector<std::string> hybrid_pattern(const std::string& pattern, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-override-pattern", pattern, "--mamba-head-dim", "16",
                                    "--mamba-num-groups", "2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}
// A Gated DeltaNet layer ('G') beside a Mamba layer: SwiGLU, RMSNorm, 2 key heads of 8, 4 value heads of 8.
std::vector<std::string> hybrid_gdn(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--swiglu", "--normalization", "RMSNorm", "--linear-num-key-heads", "2",
                               "--linear-num-value-heads", "4", "--linear-key-head-dim", "8", "--linear-value-head-dim",
                               "8"});
  return hybrid_pattern("MG", extra);
}
std::vector<std::string> hybrid_moe(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--num-experts", "4", "--moe-router-topk", "2"});
  return hybrid_pattern("ME", extra);
}

TEST(HybridArguments, MoeLayersAcceptedWithExpertTensorAndContextParallelism) {
  for (const auto& [world, flags] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {1, {}},
           {2, {"--expert-model-parallel-size", "2"}},
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"}},
           {2, {"--context-parallel-size", "2"}},
           {2, {"--context-parallel-size", "2", "--expert-model-parallel-size", "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid_moe(flags), world);
    ASSERT_TRUE(s.ok()) << "world " << world << ": " << s.to_string();
    EXPECT_EQ(cli.args.moe.layer_pattern, (std::vector<int>{0, 1})) << "the 'E' layer is the MoE layer";
  }
}

TEST(HybridArguments, ContextParallelAccepted) {
  // 8 heads: CP 2 with 2 groups (one per rank) and 1 group (its heads shared by both ranks), TP 2 x CP 2
  // (one group per TP rank, shared by its two cp ranks), CP 8 (one head per rank), and the CP algorithms
  // with Megatron's load-balanced split, and MindSpeed's adaptive ones (the all-to-alls follow the layout).
  for (const auto& [groups, world, flags] :
       std::vector<std::tuple<std::string, int64_t, std::vector<std::string>>>{
           {"2", 2, {"--context-parallel-size", "2"}},
           {"1", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
           {"2", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
           {"4", 8, {"--context-parallel-size", "8"}},
           {"4", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
           {"4", 4,
            {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp",
             "2"}},
           {"2", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}},
           {"4", 4,
            {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_adaptive_cp_algo",
             "--ulysses-degree-in-cp", "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid(groups, flags), world);
    EXPECT_TRUE(s.ok()) << groups << " groups at world " << world << ": " << s.to_string();
  }
}

// '+' layers set --multi-latent-attention (Megatron main infers it from the pattern), with TP, CP and PP.
TEST(HybridArguments, MultiLatentAttentionLayersAccepted) {
  for (const auto& [world, flags] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {1, {}},
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {2, {"--context-parallel-size", "2"}},
           {2, {"--pipeline-model-parallel-size", "2"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid_pattern("M+", flags), world);
    EXPECT_TRUE(s.ok()) << world << ": " << s.to_string();
    EXPECT_TRUE(cli.args.model.multi_latent_attention);
  }
}

// 'G' layers with their flags: one process, TP 2 with SP (2 key heads: one per rank), PP 2, and
// CP 2 (ring and all-gather; the 2 key heads split over cp).
TEST(HybridArguments, GatedDeltaNetLayersAccepted) {
  for (const auto& [world, flags] : std::vector<std::pair<int64_t, std::vector<std::string>>>{
           {1, {}},
           {2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
           {2, {"--pipeline-model-parallel-size", "2"}},
           {2, {"--context-parallel-size", "2"}},
           {2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(hybrid_gdn(flags), world);
    EXPECT_TRUE(s.ok()) << world << ": " << s.to_string();
  }
}

class HybridArgumentErrors : public ::testing::TestWithParam<FlagErrorCase> {};

TEST_P(HybridArgumentErrors, RefusedInOneLine) { testing::expect_one_line_error(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Cases, HybridArgumentErrors,
    ::testing::Values(
        FlagErrorCase{hybrid("1", {"--tensor-model-parallel-size", "2"}), 2,
                      "--mamba-num-groups: expected a multiple of --tensor-model-parallel-size (2: each rank holds "
                      "ngroups / TP groups of the Mamba mixer), found 1"},
        FlagErrorCase{hybrid("2", {"--tensor-model-parallel-size", "4", "--sequence-parallel"}), 4,
                      "--mamba-num-groups: expected a multiple of --tensor-model-parallel-size (4"},
        FlagErrorCase{hybrid_pattern("ME", {}), 1,
                      "--hybrid-override-pattern: the MoE layers ('E') of 'ME' need --num-experts, found no "
                      "--num-experts"},
        FlagErrorCase{hybrid("2", {"--num-experts", "4"}), 1,
                      "--num-experts with --is-hybrid-model: expected MoE layers ('E') in --hybrid-override-pattern, "
                      "found none in 'M*'"},
        FlagErrorCase{hybrid_moe({"--moe-layer-freq", "[0,1]"}), 1,
                      "--moe-layer-freq with --is-hybrid-model: expected no --moe-layer-freq (a hybrid model's MoE "
                      "layers are the 'E' layers of --hybrid-override-pattern), found '[0,1]'"},
        FlagErrorCase{hybrid_moe({"--expert-model-parallel-size", "2", "--moe-tp-extend-ep"}), 2,
                      "--is-hybrid-model with --num-experts and --moe-tp-extend-ep: not supported yet"},
        FlagErrorCase{hybrid_moe({"--expert-model-parallel-size", "3"}), 3,
                      "--num-experts 4 must be divisible by --expert-model-parallel-size 3"},
        // 32-channel heads: 4, so 2 per TP rank for CP 4.
        FlagErrorCase{hybrid("2", {"--mamba-head-dim", "32", "--tensor-model-parallel-size", "2",
                                   "--context-parallel-size", "4"}),
                      8,
                      "--context-parallel-size: expected a divisor of the Mamba mixer's heads per tensor-parallel "
                      "rank (2 x --hidden-size / --mamba-head-dim / --tensor-model-parallel-size = 2: each TP x CP "
                      "rank scans whole heads), found 4"},
        // Hidden 96: 12 heads in 3 groups over CP 2.
        FlagErrorCase{hybrid("3", {"--hidden-size", "96", "--context-parallel-size", "2"}), 2,
                      "--mamba-num-groups: expected, per tensor-parallel rank (--mamba-num-groups / "
                      "--tensor-model-parallel-size = 3), a multiple or a divisor of --context-parallel-size (2"},
        // Megatron-Core main's other symbols: known, Megatron's mixing rule applied, then refused.
        FlagErrorCase{hybrid_pattern("MD", {}), 1,
                      "--hybrid-override-pattern: the DeepSeek sparse attention layers ('D') of 'MD': not supported yet "
                      "(Gale's hybrid stack builds M, G, *, +, - and E layers)"},
        // '+' layers: Megatron main's mla_layer (no q/kv norms); MLA for the '*' layers is refused.
        FlagErrorCase{hybrid_pattern("M+", {"--qk-layernorm"}), 1,
                      "--qk-layernorm with the multi-latent attention layers ('+') of --hybrid-override-pattern: "
                      "expected no --qk-layernorm (Megatron's hybrid MLA layer has no q/kv layernorms), found it set"},
        // MindSpeed's --noop-layers patches TransformerBlock only: refused with its reason.
        FlagErrorCase{hybrid_pattern("M*", {"--noop-layers", "1"}), 1,
                      "--noop-layers with --is-hybrid-model: expected no --noop-layers (MindSpeed's NoopLayersFeature "
                      "replaces layers of the TransformerBlock; the hybrid stack, Megatron's MambaStack, builds its "
                      "layers from the pattern and would ignore the flag), found '1'"},
        FlagErrorCase{hybrid_pattern("M*", {"--multi-latent-attention"}), 1,
                      "--multi-latent-attention with --is-hybrid-model: expected the attention layers as multi-latent "
                      "attention layers ('+') in --hybrid-override-pattern, found '*' in 'M*'"},
        // 'G' layers: the --linear-* sizes and what GDN needs of the model.
        FlagErrorCase{hybrid_pattern("MG", {"--normalization", "RMSNorm"}), 1,
                      "the Gated DeltaNet layers ('G') of --hybrid-override-pattern needs --swiglu (the convolution's "
                      "and the output gate's activation is the model's, SiLU), found GeLU"},
        FlagErrorCase{hybrid_pattern("MG", {"--swiglu"}), 1,
                      "the Gated DeltaNet layers ('G') of --hybrid-override-pattern with --normalization LayerNorm: "
                      "not supported yet (expected RMSNorm, the gated output norm's type)"},
        FlagErrorCase{hybrid_gdn({"--linear-num-value-heads", "3"}), 1,
                      "--linear-num-value-heads: expected a multiple of --linear-num-key-heads (2), found 3"},
        FlagErrorCase{hybrid_gdn({"--linear-key-head-dim", "0"}), 1,
                      "--linear-key-head-dim: expected a positive integer with the Gated DeltaNet layers ('G') of "
                      "--hybrid-override-pattern, found 0"},
        FlagErrorCase{hybrid_gdn({"--linear-attention-freq", "2"}), 1,
                      "--linear-attention-freq needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"},
        FlagErrorCase{hybrid("2", {"--linear-num-key-heads", "2"}), 1,
                      "--linear-num-key-heads needs Gated DeltaNet layers ('G') in --hybrid-override-pattern"},
        FlagErrorCase{hybrid_gdn({"--linear-num-key-heads", "1", "--linear-num-value-heads", "2",
                                  "--tensor-model-parallel-size", "2"}),
                      2,
                      "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size (2: each rank "
                      "holds 1/TP of the Gated DeltaNet heads of the 'G' layers), found 1"},
        // CP splits each TP rank's 2 key heads: TP 2 × CP 2 needs 4.
        FlagErrorCase{hybrid_gdn({"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                  "--context-parallel-size", "2"}),
                      4,
                      "--linear-num-key-heads: expected a multiple of --tensor-model-parallel-size × "
                      "--context-parallel-size (2 × 2 = 4: each rank holds 1/(TP·CP) of the Gated DeltaNet heads of "
                      "the 'G' layers between the all-to-alls), found 2"},
        FlagErrorCase{hybrid_gdn({"--experimental-attention-variant", "gdn", "--linear-attention-freq", "2"}), 1,
                      "--experimental-attention-variant gdn with --is-hybrid-model: expected a hybrid model's Gated "
                      "DeltaNet layers as 'G' in --hybrid-override-pattern, found --experimental-attention-variant "
                      "gdn"},
        FlagErrorCase{hybrid_pattern("*D", {}), 1,
                      "--hybrid-override-pattern: expected attention layers ('*') or multi-latent / DeepSeek sparse "
                      "attention layers ('+', 'D'), not both in one model, found '*D'"},
        FlagErrorCase{hybrid_pattern("MX", {}), 1,
                      "--hybrid-override-pattern: 'X' is not a layer symbol: expected one of M (Mamba), G (Gated "
                      "DeltaNet), * (attention), + (multi-latent attention), D (DeepSeek sparse attention), - (MLP), "
                      "E (MoE)"}));

// Megatron main's --hybrid-layer-pattern: the same layers as --hybrid-override-pattern, --num-layers
// taken from the pattern's decoder layers; both flags is Megatron's error.
TEST(HybridArguments, LayerPatternIsMegatronMainsSpelling) {
  testing::PretrainCli cli;
  const Status s = cli.parse_minimal(
      {"--is-hybrid-model", "--hybrid-layer-pattern", "M*-M", "--mamba-head-dim", "16", "--mamba-num-groups", "2"});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cli.args.model.num_layers, 4);  // minimal_pretrain_flags says 2: the pattern wins, as Megatron main
  EXPECT_EQ(cli.args.model.hybrid_override_pattern, "M*-M");
  testing::PretrainCli old;
  ASSERT_TRUE(old.parse_minimal(hybrid_pattern("M*", {})).ok());
  EXPECT_EQ(old.args.model.hybrid_override_pattern, "M*");
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {{"--is-hybrid-model", "--hybrid-layer-pattern", "M*", "--hybrid-override-pattern", "M*", "--mamba-head-dim",
             "16"},
            1,
            "--hybrid-override-pattern and --hybrid-layer-pattern cannot both be specified. --hybrid-override-pattern "
            "is deprecated; use --hybrid-layer-pattern instead."},
           {{"--hybrid-layer-pattern", "M*"}, 1, "--hybrid-layer-pattern needs --is-hybrid-model"},
           {{"--hybrid-layer-pattern", "M*|M*"}, 2, "--hybrid-layer-pattern needs --is-hybrid-model"}})
    testing::expect_one_line_error(e);
}

std::vector<std::string> layer_pattern(const std::string& pattern, std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--is-hybrid-model", "--hybrid-layer-pattern", pattern, "--mamba-head-dim", "16",
                                    "--mamba-num-groups", "2"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

// Every pattern of Megatron's fixture (tests/data/reference/hybrid_pattern/megatron_parse.json, from
// Megatron main's own parser) at PP 1 to 4 through the whole argument check: where Megatron
// places the layers on one stage per pipeline rank, Gale's chunks hold the same layers (with '|':
// the segments; without: the even split); a segment count that does not divide among the ranks
// and a layer count that does not divide evenly without '|' are errors; more segments than ranks
// (virtual stages) and MTP depths are refused; Megatron's parse errors are Gale's. Patterns with
// G, E, + or D (which need other flags) are checked at the parser level only
// (tests/model/hybrid_pattern_test.cc).
TEST(HybridArguments, LayerPatternStagesAsMegatronMain) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/hybrid_pattern/megatron_parse.json");
  ASSERT_TRUE(in.good());
  int placed = 0, refused = 0, mtps = 0, interleaved = 0;
  for (const auto& c : nlohmann::json::parse(in)) {
    const std::string pattern = c.at("pattern").get<std::string>();
    if (pattern.find_first_of("GE+D") != std::string::npos) continue;
    const nlohmann::json& parse = c.at("parse");
    const bool mtp = !parse.contains("error") && parse.at("depths").get<int64_t>() > 0;
    const nlohmann::json splits = c.contains("splits") ? c.at("splits") : nlohmann::json::array({nlohmann::json{{"pp", 1}}});
    for (const auto& split : splits) {
      const int64_t pp = split.at("pp").get<int64_t>();
      testing::PretrainCli cli;
      // Micro-batches a multiple of PP (the interleaved schedule's rule, for the virtual stages).
      const Status s = cli.parse_minimal(layer_pattern(pattern, {"--pipeline-model-parallel-size", std::to_string(pp),
                                                                 "--global-batch-size", std::to_string(2 * pp)}),
                                         pp);
      const std::string where = pattern + " at PP " + std::to_string(pp) + ": " + s.to_string();
      // A pattern of MTP depths alone ("/MM/MM") has no decoder layer: Gale's --num-layers check.
      const bool no_layers = !parse.contains("error") && c.at("layers").get<int64_t>() == 0;
      const bool interleaved_pp1 =
          !split.contains("error") && pp == 1 && split.contains("vpp") && !split.at("vpp").is_null();
      if (parse.contains("error") || split.contains("error") || interleaved_pp1 || no_layers) {
        ASSERT_FALSE(s.ok()) << where;
        EXPECT_EQ(s.message().find('\n'), std::string::npos) << where;
        // Gale's order: the parse, the segments among the ranks, virtual stages, the even split
        // without '|'.
        const bool segments = split.contains("error") && split.at("kind") == "segments_not_divisible";
        std::string expected = "must be divisible by --pipeline-model-parallel-size";
        if (parse.contains("error"))
          expected = parse.at("kind") == "mtp_not_identical"    ? "must be identical"
                     : parse.at("kind") == "attention_with_mla" ? "mixes attention"
                                                                : "is not a valid layer symbol";
        else if (segments)
          expected = "the number of pipe-delimited segments";
        else if (interleaved_pp1)
          expected = "the interleaved schedule needs --pipeline-model-parallel-size > 1";
        else if (no_layers)
          expected = "--num-layers: expected a positive integer, found 0";
        EXPECT_NE(s.message().find(expected), std::string::npos) << where;
        ++refused;
        continue;
      }
      ASSERT_TRUE(s.ok()) << where;
      EXPECT_EQ(cli.args.model.num_layers, c.at("layers").get<int64_t>()) << where;
      EXPECT_EQ(cli.args.model.mtp_num_layers, mtp ? parse.at("depths").get<int64_t>() : kUnset) << where;
      mtps += mtp;
      // Every virtual stage of every rank (segments beyond PP: the interleaved schedule's chunks).
      if (!split.contains("stages")) {  // no '|': one stage, Megatron's layers
        EXPECT_EQ(chunk_layers(cli.args, 0, 0), std::make_pair(int64_t{0}, c.at("layers").get<int64_t>())) << where;
        ++placed;
        continue;
      }
      for (int64_t r = 0; r < pp; ++r)
        for (size_t v = 0; v < split.at("stages")[r].size(); ++v) {
          const auto& stage = split.at("stages")[r][v];
          EXPECT_EQ(chunk_layers(cli.args, r, static_cast<int64_t>(v)),
                    std::make_pair(stage[1].get<int64_t>(), static_cast<int64_t>(stage[0].get<std::string>().size())))
              << where << " rank " << r << " virtual stage " << v;
        }
      interleaved += split.at("stages")[0].size() > 1;
      ++placed;
    }
  }
  EXPECT_GE(placed, 12);
  EXPECT_GE(refused, 20);
  EXPECT_GE(mtps, 3);         // patterns with MTP depths placed
  EXPECT_GE(interleaved, 1);  // and with virtual stages (more segments than ranks)
}

// MTP depths after '/': Megatron main infers --mtp-num-layers from them (a warning when it was given
// otherwise, the pattern's count wins); a hybrid model's --mtp-num-layers needs them (Megatron would
// build no MTP layers); the depths' layers: tests/train/arguments_hybrid_mtp_test.cc; no context parallelism (as GPT's MTP).
TEST(HybridArguments, LayerPatternMtpDepthsGiveTheMtpLayers) {
  testing::PretrainCli cli;
  const Status s = cli.parse_minimal(layer_pattern("M*M*/M-*/M-*", {}));
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cli.args.model.mtp_num_layers, 2);
  EXPECT_EQ(cli.args.model.num_layers, 4);
  testing::PretrainCli conflict;  // Megatron: a warning, and the pattern's count wins
  ASSERT_TRUE(conflict.parse_minimal(layer_pattern("M*/*M", {"--mtp-num-layers", "3"})).ok());
  EXPECT_EQ(conflict.args.model.mtp_num_layers, 1);
  testing::PretrainCli none;  // nothing after the separators: no MTP
  ASSERT_TRUE(none.parse_minimal(layer_pattern("M*M*//", {})).ok());
  EXPECT_EQ(none.args.model.num_layers, 4);
  EXPECT_EQ(none.args.model.mtp_num_layers, kUnset);
  testing::PretrainCli pp;  // pipeline stages: the MTP block on the last one
  ASSERT_TRUE(pp.parse_minimal(layer_pattern("M*|M*/M*", {"--pipeline-model-parallel-size", "2"}), 2).ok());
  EXPECT_EQ(pp.args.model.mtp_num_layers, 1);
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {layer_pattern("M*M*", {"--mtp-num-layers", "2"}), 1,
            "--mtp-num-layers 2 with --is-hybrid-model: expected the MTP layers' pattern after '/' in "
            "--hybrid-layer-pattern (e.g. 'M*M*/MM/MM': 2 depths of 'MM'), found none in 'M*M*' (Megatron would build "
            "no MTP layers)"},
           {layer_pattern("M*/M*", {"--context-parallel-size", "2"}), 2,
            "--mtp-num-layers with --context-parallel-size 2: Megatron does not support multi-token prediction with "
            "context parallelism (expected --context-parallel-size 1)"}})
    testing::expect_one_line_error(e);
}

// '|' with an uneven split (3 + 1 layers, and 5 layers that the even split would refuse at PP 2),
// and an empty first stage (Megatron allows it: rank 0 holds only the embedding).
TEST(HybridArguments, LayerPatternPipesGiveTheStages) {
  for (const auto& [pattern, pp, first, last] : std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>>{
           {"M*-|M", 2, 3, 1}, {"M*-|M*", 2, 3, 2}, {"|M*M*", 2, 0, 4}, {"M|*-M|M*|-", 4, 1, 1}}) {
    testing::PretrainCli cli;
    const Status s = cli.parse_minimal(layer_pattern(pattern, {"--pipeline-model-parallel-size", std::to_string(pp)}), pp);
    ASSERT_TRUE(s.ok()) << pattern << ": " << s.to_string();
    EXPECT_EQ(cli.args.parallel.virtual_pipeline_model_parallel_size, 1) << pattern;
    EXPECT_EQ(chunk_layers(cli.args, 0, 0).second, first) << pattern;
    EXPECT_EQ(chunk_layers(cli.args, pp - 1, 0).second, last) << pattern;
  }
  // --hybrid-override-pattern is read as --hybrid-layer-pattern by Megatron main: its separators too.
  testing::PretrainCli old;
  const Status s = old.parse_minimal(hybrid_pattern("M*-|M", {"--pipeline-model-parallel-size", "2"}), 2);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(old.args.model.num_layers, 4);
  EXPECT_EQ(chunk_layers(old.args, 0, 0), std::make_pair(int64_t{0}, int64_t{3}));
}

// More segments than pipeline ranks: segment k = v·PP + r is virtual stage v of rank r (Megatron
// main's select_pipeline_segment), run by the interleaved schedule.
TEST(HybridArguments, LayerPatternSegmentsBeyondThePipelineRanksAreVirtualStages) {
  testing::PretrainCli cli;
  const Status s = cli.parse_minimal(
      layer_pattern("M*|-|MM-|*-M*/*M", {"--pipeline-model-parallel-size", "2", "--global-batch-size", "4"}), 2);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(cli.args.parallel.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(cli.args.model.mtp_num_layers, 1);
  EXPECT_EQ(chunk_layers(cli.args, 0, 0), std::make_pair(int64_t{0}, int64_t{2}));  // "M*"
  EXPECT_EQ(chunk_layers(cli.args, 1, 0), std::make_pair(int64_t{2}, int64_t{1}));  // "-"
  EXPECT_EQ(chunk_layers(cli.args, 0, 1), std::make_pair(int64_t{3}, int64_t{3}));  // "MM-"
  EXPECT_EQ(chunk_layers(cli.args, 1, 1), std::make_pair(int64_t{6}, int64_t{4}));  // "*-M*", then the MTP block
}

// Megatron main's errors for the pipeline flags that --hybrid-layer-pattern replaces.
TEST(HybridArguments, LayerPatternPipelineFlagErrorsAsMegatronMain) {
  for (const FlagErrorCase& e : std::vector<FlagErrorCase>{
           {layer_pattern("M*|M*", {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"}),
            2,
            "If --hybrid-layer-pattern contains pipe separators, --decoder-first-pipeline-num-layers should not be "
            "specified as the pipeline layout is explicitly defined"},
           {layer_pattern("M*|M*", {"--pipeline-model-parallel-size", "2", "--decoder-last-pipeline-num-layers", "1"}),
            2,
            "If --hybrid-layer-pattern contains pipe separators, --decoder-last-pipeline-num-layers should not be "
            "specified"},
           {layer_pattern("M*M*", {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                   "1"}),
            2, "--num-layers-per-virtual-pipeline-stage should not be used with --hybrid-layer-pattern"},
           {layer_pattern("M*M*", {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank",
                                   "2"}),
            2, "--num-virtual-stages-per-pipeline-rank should not be used with --hybrid-layer-pattern"},
           {layer_pattern("M*M*", {"--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout",
                                   "Et*2|t*2L"}),
            2, "--pipeline-model-parallel-layout should not be used with --hybrid-layer-pattern"},
           {layer_pattern("M*M", {"--pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split"}),
            2, "--account-for-embedding-in-pipeline-split should not be used with --hybrid-layer-pattern"},
           {layer_pattern("M*M", {"--pipeline-model-parallel-size", "2", "--account-for-loss-in-pipeline-split"}), 2,
            "--account-for-loss-in-pipeline-split should not be used with --hybrid-layer-pattern"},
           {layer_pattern("M*|M*|M*", {"--pipeline-model-parallel-size", "2"}), 2,
            "--hybrid-layer-pattern 'M*|M*|M*': the number of pipe-delimited segments (3) must be evenly divisible "
            "by --pipeline-model-parallel-size (2)"},
           {layer_pattern("M*|M*", {}), 1,
            "--hybrid-layer-pattern 'M*|M*' has 2 pipe-delimited segments: with --pipeline-model-parallel-size 1 they "
            "are virtual pipeline stages, and the interleaved schedule needs --pipeline-model-parallel-size > 1"},
           // Virtual stages run the interleaved schedule, with its rule on the micro-batches.
           {layer_pattern("M|*|M|*", {"--pipeline-model-parallel-size", "2"}), 2,
            "the interleaved pipeline schedule needs the micro-batches per iteration (--global-batch-size 2 / "
            "(--micro-batch-size 2 x data-parallel size 1) = 1) to be a multiple of --pipeline-model-parallel-size 2"},
           {layer_pattern("M*|Mx", {"--pipeline-model-parallel-size", "2"}), 2,
            "--hybrid-layer-pattern 'M*|Mx': in the main pattern, 'x' is not a valid layer symbol"},
           {layer_pattern("M*/M|M", {}), 1,
            "--hybrid-layer-pattern 'M*/M|M': in the MTP pattern, '|' is not a valid layer symbol"},
           {layer_pattern("M*/MM/M*", {}), 1,
            "--hybrid-layer-pattern 'M*/MM/M*': all MTP patterns (after each '/') must be identical, found 'MM' as "
            "MTP pattern 1 and 'M*' as MTP pattern 2"}})
    testing::expect_one_line_error(e);
}

}  // namespace
}  // namespace gale
