// --dist-train (MindSpeed's DistTrainFeature): the dist_config of --mm-model (train/dist_train_config.h)
// and its errors (each names the field, what was expected and what was found), what the flags refuse
// with it, each rank's view of the arguments, and the registry entry.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <unistd.h>

#include "resolved_features.h"
#include "train/dist_train_config.h"

namespace gale {
namespace {

// A dist_config with the given model_config entries (JSON text).
std::string config(const std::string& entries, const std::string& extra = "") {
  return "{\"dist_config\": {\"model_name\": \"gpt\"" + extra + ", \"model_config\": [" + entries + "]}}";
}

const std::string kEncoder =
    "{\"name\": \"encoder\", \"model_index\": 0, \"world_size\": 1, \"tensor_model_parallel_size\": 1, "
    "\"num_layers\": 2}";
const std::string kDecoder =
    "{\"name\": \"decoder\", \"model_index\": 1, \"world_size\": 4, \"tensor_model_parallel_size\": 2, "
    "\"pipeline_model_parallel_size\": 2, \"num_layers\": 4, \"main_dp\": true}";

// The error of parsing `text` for a 5-rank job of 6 layers ("" when it parses).
std::string error_of(const std::string& text, int64_t world = 5, int64_t layers = 6) {
  StatusOr<DistTrainLayout> l = parse_dist_train_config(text, "model.json", world, layers);
  return l.ok() ? "" : l.status().message();
}

TEST(DistTrainConfig, ParsesSubWorldsInModelIndexOrder) {
  // The entries in reverse order: model_index decides.
  StatusOr<DistTrainLayout> l = parse_dist_train_config(config(kDecoder + ", " + kEncoder), "model.json", 5, 6);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->subworlds.size(), 2u);
  const DistTrainSubWorld& e = l->subworlds[0];
  const DistTrainSubWorld& d = l->subworlds[1];
  EXPECT_EQ(e.name, "encoder");
  EXPECT_EQ(e.first_rank, 0);
  EXPECT_EQ(e.dp, 1);
  EXPECT_EQ(d.first_rank, 1);
  EXPECT_EQ(d.first_stage, 1);
  EXPECT_EQ(d.tp, 2);
  EXPECT_EQ(d.pp, 2);
  EXPECT_EQ(d.dp, 1);
  EXPECT_EQ(l->num_stages(), 3);
  EXPECT_EQ(l->stage_layers(), (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(dist_train_vocab_tp(*l), 2);
  const std::string text = render_dist_train_layout(*l);
  EXPECT_NE(text.find("decoder: ranks 1-4, TP 2 PP 2 DP 1, pipeline stages 1-2, layers 2-5"), std::string::npos) << text;
}

TEST(DistTrainConfig, ErrorsNameTheFieldTheExpectedAndTheFound) {
  const std::string both = kEncoder + ", " + kDecoder;
  EXPECT_NE(error_of("not json").find("expected a JSON file"), std::string::npos);
  EXPECT_NE(error_of("{\"model\": 1}").find("found no \"dist_config\""), std::string::npos);
  EXPECT_NE(error_of(config(both, ", \"extra\": 1")).find("dist_config.extra: unknown key"), std::string::npos);
  EXPECT_NE(error_of(config(kEncoder)).find("expected at least 2 sub-worlds, found 1"), std::string::npos);
  EXPECT_NE(error_of(config(both), 6).find("world_size must sum to the job's 6 ranks, found 5"), std::string::npos);
  EXPECT_NE(error_of(config(both), 5, 8).find("num_layers must sum to --num-layers 8, found 6"), std::string::npos);
  std::string bad = both;
  bad.replace(bad.find("\"world_size\": 4"), 15, "\"world_size\": 3");
  EXPECT_NE(error_of(config(bad), 4).find("model_config[1] (\"decoder\").world_size: expected a multiple of "
                                          "tensor_model_parallel_size 2 x pipeline_model_parallel_size 2 x "
                                          "context_parallel_size 1 = 4, found 3"),
            std::string::npos)
      << error_of(config(bad), 4);
  bad = both;
  bad.replace(bad.find("\"num_layers\": 4"), 15, "\"num_layers\": 3");
  EXPECT_NE(error_of(config(bad), 5, 5).find("(\"decoder\").num_layers: expected a multiple of "
                                             "pipeline_model_parallel_size 2"),
            std::string::npos);
  bad = both;
  bad.replace(bad.find("\"model_index\": 1"), 16, "\"model_index\": 2");
  EXPECT_NE(error_of(config(bad)).find("expected model_index 0 to 1 once each, found 2 for \"decoder\""),
            std::string::npos);
  bad = both;
  bad.replace(bad.find("\"decoder\""), 9, "\"encoder\"");
  EXPECT_NE(error_of(config(bad)).find("\"encoder\" is used twice"), std::string::npos);
  bad = both;
  bad.replace(bad.find("\"decoder\""), 9, "\"2nd\"");
  EXPECT_NE(error_of(config(bad)).find("name: expected an identifier string, found \"2nd\""), std::string::npos);
  EXPECT_NE(error_of(config(kEncoder + ", " + kDecoder.substr(0, kDecoder.size() - 1) + ", \"_x\": 1}"))
                .find("_x: a key may not start with '_'"),
            std::string::npos);
  EXPECT_NE(error_of(config(kEncoder + ", " + kDecoder.substr(0, kDecoder.size() - 1) + ", \"layers\": 1}"))
                .find("model_config[1].layers: unknown key"),
            std::string::npos);
  EXPECT_NE(error_of(config(both.substr(0, both.size() - 1) + ", \"forward_only\": 1}"))
                .find("forward_only: expected a boolean, found 1"),
            std::string::npos);
  bad = both;
  bad.replace(bad.find("\"tensor_model_parallel_size\": 1"), 31, "\"tensor_model_parallel_size\": 0");
  EXPECT_NE(error_of(config(bad)).find("(\"encoder\").tensor_model_parallel_size: expected an integer >= 1, found 0"),
            std::string::npos);
  EXPECT_NE(error_of(config(kEncoder.substr(0, kEncoder.size() - 1) + ", \"main_dp\": true}, " + kDecoder))
                .find("expected at most one main_dp true, found 2"),
            std::string::npos);
}

TEST(DistTrainConfig, NotSupportedYet) {
  const std::string both = kEncoder + ", " + kDecoder;
  EXPECT_NE(error_of(config(both, ", \"use_multiparam_send_recv\": true"))
                .find("use_multiparam_send_recv true: not supported yet"),
            std::string::npos);
  // forward_only: a leading run of sub-worlds only, never the last.
  const std::string frozen_encoder = kEncoder.substr(0, kEncoder.size() - 1) + ", \"forward_only\": true}";
  EXPECT_EQ(error_of(config(frozen_encoder + ", " + kDecoder)), "");
  EXPECT_NE(error_of(config(kEncoder + ", " + kDecoder.substr(0, kDecoder.size() - 1) + ", \"forward_only\": true}"))
                .find("(\"decoder\").forward_only: expected false for the last sub-world (it computes the loss), "
                      "found true"),
            std::string::npos);
  const std::string middle =
      "{\"name\": \"middle\", \"model_index\": 1, \"world_size\": 1, \"num_layers\": 1, \"forward_only\": true}";
  std::string last = kDecoder;
  last.replace(last.find("\"model_index\": 1"), 16, "\"model_index\": 2");
  EXPECT_NE(error_of(config(kEncoder + ", " + middle + ", " + last), 6, 7)
                .find("(\"middle\").forward_only true after the trainable \"encoder\": not supported yet"),
            std::string::npos)
      << error_of(config(kEncoder + ", " + middle + ", " + last), 6, 7);
  std::string cp = kDecoder;
  cp.replace(cp.find("\"world_size\": 4"), 15, "\"world_size\": 8, \"context_parallel_size\": 2");
  EXPECT_NE(error_of(config(kEncoder + ", " + cp), 9).find("(\"decoder\").context_parallel_size 2: sub-worlds of different context-parallel sizes "
                      "(\"encoder\" has 1): not supported yet"),
            std::string::npos)
      << error_of(config(kEncoder + ", " + cp), 9);
  // DP 2 and DP 3: not multiples.
  const std::string enc2 =
      "{\"name\": \"encoder\", \"model_index\": 0, \"world_size\": 2, \"num_layers\": 2}";
  std::string dp3 = kDecoder;
  dp3.replace(dp3.find("\"world_size\": 4"), 15, "\"world_size\": 12");
  EXPECT_NE(error_of(config(enc2 + ", " + dp3), 14)
                .find("sub-worlds whose data-parallel sizes (world_size / (tensor x pipeline size)) are not multiples "
                      "of the smallest, 2 (\"decoder\" has 3): not supported yet"),
            std::string::npos)
      << error_of(config(enc2 + ", " + dp3), 14);
}

TEST(DistTrainConfig, DataParallelSizesThatAreMultiples) {
  // encoder DP 1 (main), decoder DP 2.
  std::string dp2 = kDecoder;
  dp2.replace(dp2.find("\"world_size\": 4"), 15, "\"world_size\": 8");
  StatusOr<DistTrainLayout> l = parse_dist_train_config(config(kEncoder + ", " + dp2), "model.json", 9, 6);
  ASSERT_FALSE(l.ok());  // kDecoder says main_dp: it must be a sub-world of the smallest DP
  EXPECT_NE(l.status().message().find("(\"decoder\").main_dp: expected the sub-world of the smallest data-parallel "
                                      "size 1 (the job's), found one of 2"),
            std::string::npos)
      << l.status().message();
  dp2.replace(dp2.find(", \"main_dp\": true"), 17, "");
  l = parse_dist_train_config(config(kEncoder + ", " + dp2), "model.json", 9, 6);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->dp(), 1);
  EXPECT_EQ(l->dp_ratio(1), 2);
}

// --dist-train arguments for a job of `world` ranks seen by `rank`, with `config_text` as --mm-model.
struct DistTrainArgs {
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  Status status;
  DistTrainArgs(const std::string& config_text, std::vector<std::string> flags, int64_t world = 5, int64_t rank = 0) {
    const std::string path = str_cat(::testing::TempDir(), "gale_dist_train_args_", getpid(), ".json");
    std::ofstream(path) << config_text;
    add_all_pretrain_args(parser, args);
    std::vector<std::string> argv = {"gale", "--num-layers", "6", "--hidden-size", "16", "--num-attention-heads", "2",
                                     "--seq-length", "8", "--max-position-embeddings", "8", "--micro-batch-size", "1",
                                     "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                     "--untie-embeddings-and-output-weights", "--dist-train", "--mm-model", path};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    status = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
    if (status.ok()) status = validate_all_pretrain_args(args, parser, world, rank);
    std::remove(path.c_str());
  }
};

TEST(DistTrainArgs, EachRankGetsItsSubWorldsView) {
  const std::string text = config(kEncoder + ", " + kDecoder);
  DistTrainArgs enc(text, {}, 5, 0), dec(text, {}, 5, 3);
  ASSERT_TRUE(enc.status.ok()) << enc.status.message();
  ASSERT_TRUE(dec.status.ok()) << dec.status.message();
  for (const Arguments* a : {&enc.args, &dec.args}) {
    EXPECT_TRUE(a->parallel.dist_train);
    EXPECT_EQ(a->parallel.pipeline_model_parallel_size, 3);
    EXPECT_EQ(a->parallel.pipeline_layers, (std::vector<std::vector<int64_t>>{{2}, {2}, {2}}));
    EXPECT_EQ(a->parallel.data_parallel_size, 1);
    EXPECT_EQ(a->parallel.world_size, 5);
  }
  EXPECT_EQ(enc.args.parallel.tensor_model_parallel_size, 1);
  EXPECT_EQ(enc.args.parallel.dist_train_subworld, 0);
  EXPECT_EQ(dec.args.parallel.tensor_model_parallel_size, 2);
  EXPECT_EQ(dec.args.parallel.dist_train_subworld, 1);
}

TEST(DistTrainArgs, Refusals) {
  const std::string text = config(kEncoder + ", " + kDecoder);
  auto message = [&](std::vector<std::string> flags) { return DistTrainArgs(text, std::move(flags)).status.message(); };
  EXPECT_NE(message({"--tensor-model-parallel-size", "2"})
                .find("--dist-train takes the parallel layout from --mm-model's dist_config (each sub-world's "
                      "tensor/pipeline/context-parallel sizes and num_layers): expected no "
                      "--tensor-model-parallel-size, found it given"),
            std::string::npos);
  EXPECT_NE(message({"--num-layer-list", "3,3"}).find("expected no --num-layer-list"), std::string::npos);
  // --sequence-parallel: TP sizes that do not divide one another (2 and 3).
  const std::string tp2 = "{\"name\": \"encoder\", \"model_index\": 0, \"world_size\": 2, "
                          "\"tensor_model_parallel_size\": 2, \"num_layers\": 2}";
  const std::string tp3 = "{\"name\": \"decoder\", \"model_index\": 1, \"world_size\": 3, "
                          "\"tensor_model_parallel_size\": 3, \"num_layers\": 4}";
  EXPECT_NE(DistTrainArgs(config(tp2 + ", " + tp3), {"--sequence-parallel"}, 5)
                .status.message()
                .find("--dist-train with --sequence-parallel and neighbouring sub-worlds whose tensor-parallel sizes "
                      "do not divide one another (\"encoder\" 2, \"decoder\" 3): their sequence slices would not "
                      "nest: not supported yet"),
            std::string::npos)
      << DistTrainArgs(config(tp2 + ", " + tp3), {"--sequence-parallel"}, 5).status.message();
  // A sub-world's view that fails the usual checks names the sub-world: 2 heads do not divide by TP 4.
  std::string tp4 = kDecoder;
  tp4.replace(tp4.find("\"tensor_model_parallel_size\": 2"), 31, "\"tensor_model_parallel_size\": 4");
  tp4.replace(tp4.find("\"world_size\": 4"), 15, "\"world_size\": 8");
  const std::string m = DistTrainArgs(config(kEncoder + ", " + tp4), {}, 9).status.message();
  EXPECT_NE(m.find("--dist-train sub-world \"decoder\" (tensor_model_parallel_size 4, pipeline stages 1-2 of 3): "),
            std::string::npos)
      << m;
  // No --mm-model.
  ArgParser parser("gale pretrain", "test");
  Arguments args;
  add_all_pretrain_args(parser, args);
  std::vector<std::string> argv = {"gale", "--dist-train", "--untie-embeddings-and-output-weights"};
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  ASSERT_TRUE(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()).ok());
  EXPECT_NE(validate_all_pretrain_args(args, parser, 2).message().find("--dist-train needs --mm-model FILE"),
            std::string::npos);
}

TEST(DistTrainArgs, DataParallelSizesThatDiffer) {
  // encoder TP 1 x DP 2 (ranks 0-1), decoder TP 2 x PP 2 x DP 1 (ranks 2-5): the encoder's replicas
  // run micro-batches of half the size.
  const std::string enc2 =
      "{\"name\": \"encoder\", \"model_index\": 0, \"world_size\": 2, \"num_layers\": 2}";
  const std::string text = config(enc2 + ", " + kDecoder);
  DistTrainArgs enc(text, {"--micro-batch-size", "2"}, 6, 1), dec(text, {"--micro-batch-size", "2"}, 6, 2);
  ASSERT_TRUE(enc.status.ok()) << enc.status.message();
  ASSERT_TRUE(dec.status.ok()) << dec.status.message();
  EXPECT_EQ(enc.args.training.micro_batch_size, 1);
  EXPECT_EQ(enc.args.parallel.data_parallel_size, 2);
  EXPECT_EQ(dec.args.training.micro_batch_size, 2);
  EXPECT_EQ(dec.args.parallel.data_parallel_size, 1);
  EXPECT_NE(DistTrainArgs(text, {}, 6).status.message().find(
                "--dist-train: sub-world \"encoder\" has 2 times the data-parallel size 1 and splits each micro-batch "
                "as many ways: expected a --micro-batch-size divisible by 2, found 1"),
            std::string::npos);
  EXPECT_NE(DistTrainArgs(text, {"--micro-batch-size", "2", "--use-distributed-optimizer"}, 6)
                .status.message()
                .find("--dist-train with --use-distributed-optimizer and sub-worlds of different data-parallel sizes: "
                      "not supported yet"),
            std::string::npos);
}

TEST(DistTrainArgs, MissingConfigFile) {
  const std::string path = str_cat(::testing::TempDir(), "gale_dist_train_missing_", getpid(), ".json");
  EXPECT_EQ(validated_pretrain_args({"--dist-train", "--mm-model", path}).message(),
            str_cat("--mm-model ", path, ": cannot open the file"));
}

TEST(DistTrainFeature, RegistryEntryAndConflicts) {
  auto registry = make_feature_registry();
  const Feature* f = registry->find("dist-train");
  ASSERT_NE(f, nullptr);
  EXPECT_TRUE(f->implemented());
  EXPECT_EQ(f->flag(), "--dist-train");
  EXPECT_EQ(f->module(), FeatureModule::kMultimodal);
  EXPECT_EQ(f->level(), 0);  // the layout cannot depend on the optimization level
  EXPECT_EQ(f->counterpart(), "MindSpeed DistTrainFeature (L2)");
  expect_one_line_refusal({"--dist-train", "--optimize-send-recv-comm"},
                          "--dist-train with --optimize-send-recv-comm: not supported yet");
  expect_one_line_refusal({"--dist-train", "--use-multiparameter-pipeline-model-parallel"},
                          "--dist-train with --use-multiparameter-pipeline-model-parallel: not supported yet");
  ResolvedFeatures r({"--dist-train"});
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_TRUE(r.registry->active("dist-train"));
}

}  // namespace
}  // namespace gale
