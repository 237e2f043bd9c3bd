// Megatron-Core MoE checkpoints (tests/data/megatron/moe/, tools/reference/megatron_moe_reference.py) read as Gale's model.
//
// One tiny MoE GPT (2 MoE layers, 4 experts, top-2, sigmoid scores with an expert bias, a shared
// expert) saved by Megatron core_v0.12.1 in five layouts: legacy torch at EP 1 (SequentialMLP), at
// TP 2 x EP 2, at EP 2 with GroupedMLP's weight1/weight2 and with TEGroupedMLP's weight<i>, and
// torch_dist, and torch_dcp. Each reads to the same Gale tensors, and Gale's forward on them reproduces Megatron's
// logits and per-token losses; torch_dist's optimizer state reads per expert; Gale writes the
// fixture's TP 2 x EP 2 files as Megatron shards them, and a moe_layer_freq list both ways.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_moe_names.h"
#include "train/megatron_fixture.h"

namespace gale {
namespace {

using testing_util::TempDir;
using namespace megatron_fixture;
namespace fs = std::filesystem;

const char* const kLayouts[] = {"moe/torch_ep1", "moe/torch_tp2ep2", "moe/torch_grouped_ep2",
                                "moe/torch_te_grouped_ep2", "moe/torch_dist", "moe/torch_dcp"};

TEST(MegatronMoe, EveryLayoutReproducesMegatronsLogits) {
  const Reference ref = read_reference("moe/reference.json");
  auto ep1 = read_megatron_checkpoint(fixture("moe/torch_ep1"));
  ASSERT_TRUE(ep1.ok()) << ep1.status().message();
  for (const char* layout : kLayouts) {
    SCOPED_TRACE(layout);
    auto m = read_megatron_checkpoint(fixture(layout));
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->moe.num_experts, 4);
    EXPECT_EQ(m->moe.moe_router_topk, 2);
    EXPECT_EQ(m->moe.moe_ffn_hidden_size, 8);
    EXPECT_EQ(m->moe.moe_shared_expert_intermediate_size, 8);
    EXPECT_EQ(m->moe.moe_router_score_function, "sigmoid");
    EXPECT_TRUE(m->moe.moe_router_enable_expert_bias);
    ASSERT_EQ(m->tensors.size(), ep1->tensors.size());
    for (const auto& [name, t] : ep1->tensors) {
      auto it = m->tensors.find(name);
      ASSERT_NE(it, m->tensors.end()) << name;
      EXPECT_TRUE(same_tensor(it->second, t)) << name;
    }
    EXPECT_EQ(m->tensors.at("decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight").shape(), (Shape{16, 16}));
    EXPECT_EQ(m->tensors.at("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight").shape(), (Shape{16, 8}));
    EXPECT_EQ(m->tensors.at("decoder.layers.0.mlp.router.expert_bias").shape(), (Shape{4}));
    auto loaded = build_model(*m);
    const Comparison c = compare(*loaded->model, ref);
    EXPECT_LT(c.max_logit_diff, kLogitTolerance);
    EXPECT_LT(c.max_loss_diff, kLogitTolerance);
  }
}

// The golden comparison depends on the expert numbering: experts 0 and 2 of layer 0 swapped (as a
// reader that kept each expert-parallel file's local numbers would place them) change the logits.
TEST(MegatronMoe, GoldenComparisonDetectsSwappedExperts) {
  auto m = read_megatron_checkpoint(fixture("moe/torch_ep1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (const char* w : {"linear_fc1.weight", "linear_fc2.weight"})
    std::swap(m->tensors.at(str_cat("decoder.layers.0.mlp.experts.local_experts.0.", w)),
              m->tensors.at(str_cat("decoder.layers.0.mlp.experts.local_experts.2.", w)));
  auto loaded = build_model(*m);
  EXPECT_GT(compare(*loaded->model, read_reference("moe/reference.json")).max_logit_diff, 1e-2);
}

TEST(MegatronMoe, GaleCheckpointRecordsTheMoeFlags) {
  auto m = read_megatron_checkpoint(fixture("moe/torch_grouped_ep2"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_TRUE(m->moe.moe_grouped_gemm);
  TempDir tmp;
  ASSERT_TRUE(save_megatron_as_gale(*m, tmp.file("g"), "fixture").ok());
  std::ifstream in(tmp.file("g/iter_0000007/metadata.json"));
  const nlohmann::json args = nlohmann::json::parse(in)["args"];
  EXPECT_EQ(args["num_experts"], 4);
  EXPECT_EQ(args["moe_layer_freq"], "1");  // Megatron's int 1 as Gale's flag spelling
  EXPECT_EQ(args["moe_shared_expert_intermediate_size"], 8);
  EXPECT_EQ(args["moe_router_enable_expert_bias"], true);
}

// torch_dist's optimizer state (SGD momentum, every buffer 0.01) reads under Gale's per-expert names.
TEST(MegatronMoe, TorchDistOptimizerStateOfTheExperts) {
  auto m = read_megatron_checkpoint(fixture("moe/torch_dist"), kUnset, /*with_optimizer=*/true);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->optimizer.has_value());
  const auto& momentum = m->optimizer->tensors.at("momentum_buffer");
  EXPECT_EQ(momentum.size(), m->tensors.size() - 2);  // every parameter but the two expert-bias buffers
  for (int64_t e = 0; e < 4; ++e)
    for (const char* w : {"linear_fc1.weight", "linear_fc2.weight"}) {
      const std::string name = str_cat("decoder.layers.1.mlp.experts.local_experts.", e, ".", w);
      auto it = momentum.find(name);
      ASSERT_NE(it, momentum.end()) << name;
      EXPECT_EQ(it->second.shape(), m->tensors.at(name).shape()) << name;
      EXPECT_FLOAT_EQ(it->second.data<float>()[it->second.numel() - 1], 0.01f) << name;
    }
}

// Gale writes the fixture at TP 2 x EP 2 file for file as the TP 2 x EP 2 fixture (Megatron's
// sharding; _extra_state entries included) with the MoE args, and reads it back.
TEST(MegatronMoe, WritesTheFixturesShardsAtTp2Ep2) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("moe/torch_ep1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.tensor_parallel = 2;
  o.expert_parallel = 2;
  o.moe = m->moe;
  Status s = write_fixture_as_megatron(*m, o);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const char* rank : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"})
    expect_same_rank_file(tmp.file(str_cat("mg/iter_0000007/", rank, "/model_optim_rng.pt")),
                          fixture(str_cat("moe/torch_tp2ep2/iter_0000007/", rank, "/model_optim_rng.pt")),
                          [](const PyValue& args, const PyValue& want) {
                            for (const char* key : {"num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                                                    "moe_layer_freq", "moe_shared_expert_intermediate_size",
                                                    "expert_model_parallel_size", "expert_tensor_parallel_size",
                                                    "tensor_model_parallel_size"})
                              EXPECT_EQ(args.attr(key)->i, want.attr(key)->i) << key;
                            EXPECT_EQ(args.attr("moe_router_score_function")->s, "sigmoid");
                            EXPECT_TRUE(args.attr("moe_router_enable_expert_bias")->b);
                          });
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  for (const auto& [name, t] : m->tensors) EXPECT_TRUE(same_tensor(t, back->tensors.at(name))) << name;
}

// A model whose layer 0 is dense (moe_layer_freq [0,1]): Megatron's list in the args both ways, the
// dense layer's MLP and _extra_state names, the MoE layer's experts.
TEST(MegatronMoe, LayerFreqListBothWays) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("moe/torch_ep1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors)
    if (name.find("layers.0.mlp.") == std::string::npos) tensors.push_back({name, t});
  Tensor fc1 = Tensor::empty({64, 16}), fc2 = Tensor::empty({16, 32});
  fc1.fill(0.5f);
  fc2.fill(0.25f);
  tensors.push_back({"decoder.layers.0.mlp.linear_fc1.weight", fc1});
  tensors.push_back({"decoder.layers.0.mlp.linear_fc2.weight", fc2});
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.expert_parallel = 2;
  o.moe = m->moe;
  o.moe.moe_layer_freq = "[0,1]";
  o.moe.layer_pattern = {0, 1};
  Status s = write_megatron_checkpoint(o, m->model, tensors);
  ASSERT_TRUE(s.ok()) << s.message();
  auto file = read_torch_file(tmp.file("mg/iter_0000000/mp_rank_00_001/model_optim_rng.pt"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  const PyValue* freq = (*file)->get("args")->attr("moe_layer_freq");
  ASSERT_EQ(freq->kind, PyValue::kList);
  ASSERT_EQ(freq->items.size(), 2u);
  EXPECT_EQ(freq->items[0]->i, 0);
  EXPECT_EQ(freq->items[1]->i, 1);
  const PyValue* sd = (*file)->get("model");
  EXPECT_NE(sd->get("decoder.layers.0.mlp.linear_fc1._extra_state"), nullptr);
  EXPECT_NE(sd->get("decoder.layers.1.mlp.experts.local_experts.1.linear_fc2._extra_state"), nullptr);
  EXPECT_EQ(sd->get("decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight"), nullptr);  // EP rank 1: 2, 3
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->moe.moe_layer_freq, "[0,1]");
  EXPECT_EQ(back->moe.layer_pattern, (std::vector<int>{0, 1}));
  ASSERT_EQ(back->tensors.size(), tensors.size());
  for (const NamedTensor& nt : tensors) EXPECT_TRUE(same_tensor(nt.tensor, back->tensors.at(nt.name))) << nt.name;
}

// Megatron main's quantile_balancing router keeps a persistent f32 buffer decoder.layers.<i>.mlp.router.qb_beta
// [E] (router.py registers it without persistent=False; qb_beta_accum / qb_beta_count are not saved), the same
// on every TP and EP rank: Gale writes it into every TP 2 x EP 2 rank file under that name, with the load-balancing
// type in the args, reads it back into its own qb_beta, and a run that differs in quantile balancing is told so.
TEST(MegatronMoe, QuantileBalancingBufferBothWays) {
  TempDir tmp;
  auto m = read_megatron_checkpoint(fixture("moe/torch_ep1"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m->tensors) tensors.push_back({name, t});
  std::map<std::string, Tensor> betas;
  for (int layer : {0, 1}) {
    Tensor beta = Tensor::empty({4});
    for (int e = 0; e < 4; ++e) beta.data<float>()[e] = 0.125f * static_cast<float>(e + 4 * layer) - 0.5f;
    const std::string name = str_cat("decoder.layers.", layer, ".mlp.router.qb_beta");
    betas[name] = beta;
    tensors.push_back({name, beta});
  }
  MegatronSaveOptions o;
  o.save_dir = tmp.file("mg");
  o.tensor_parallel = 2;
  o.expert_parallel = 2;
  o.moe = m->moe;
  o.moe.moe_router_load_balancing_type = "quantile_balancing";
  o.moe.moe_router_quantile_balancing_ema = 0.5;
  Status s = write_megatron_checkpoint(o, m->model, tensors);
  ASSERT_TRUE(s.ok()) << s.message();
  for (const char* rank : {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"}) {
    SCOPED_TRACE(rank);
    auto file = read_torch_file(tmp.file(str_cat("mg/iter_0000000/", rank, "/model_optim_rng.pt")));
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_EQ((*file)->get("args")->attr("moe_router_load_balancing_type")->s, "quantile_balancing");
    EXPECT_EQ((*file)->get("args")->attr("moe_router_quantile_balancing_ema")->f, 0.5);
    const PyValue* sd = (*file)->get("model");
    for (const auto& [name, beta] : betas) {
      const PyValue* v = sd->get(name);
      ASSERT_NE(v, nullptr) << name;
      ASSERT_EQ(v->kind, PyValue::kTensor) << name;
      EXPECT_EQ(v->data.dtype(), DType::kF32);
      EXPECT_TRUE(same_tensor(v->data, beta)) << name;
    }
  }
  auto back = read_megatron_checkpoint(tmp.file("mg"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->moe.uses_load_balancing_type("quantile_balancing"));
  EXPECT_EQ(back->moe.moe_router_quantile_balancing_ema, 0.5);
  for (const auto& [name, beta] : betas) EXPECT_TRUE(same_tensor(beta, back->tensors.at(name))) << name;
  MoeArgs run = back->moe;
  EXPECT_TRUE(check_megatron_moe_run(back->moe, run, "dir").ok());
  run.moe_router_load_balancing_type = "aux_loss";
  EXPECT_EQ(check_megatron_moe_run(back->moe, run, "dir").message(),
            "dir: Megatron's checkpoint was saved with --moe-router-load-balancing-type quantile_balancing (its "
            "mlp.router.qb_beta buffers), this run has another type");
  EXPECT_EQ(check_megatron_moe_run(run, back->moe, "dir").message(),
            "dir: Megatron's checkpoint was saved with --moe-router-load-balancing-type other than "
            "quantile_balancing, this run has quantile_balancing");
}

// A copy of `fixture_name` in tmp/c whose rank file `rank` has its args attribute `key` set to `value`.
void with_arg(const TempDir& tmp, const std::string& fixture_name, const std::string& rank, const std::string& key,
              PyRef value) {
  fs::copy(fixture(fixture_name), tmp.file("c"), fs::copy_options::recursive);
  const std::string pt = tmp.file("c/iter_0000007/" + rank + "/model_optim_rng.pt");
  auto root = read_torch_file(pt);
  ASSERT_TRUE(root.ok()) << root.status().message();
  PyValue* args = const_cast<PyValue*>((*root)->get("args"));
  args->state->set(key, std::move(value));
  ASSERT_TRUE(write_torch_file(pt, **root).ok());
}

// torch_dcp keeps one copy of keys every rank saves: an expert-parallel save lost the other ranks' experts.
TEST(MegatronMoeErrors, ATorchDcpSavedAtExpertParallelTwoIsRefused) {
  TempDir tmp;
  fs::copy(fixture("moe/torch_dcp"), tmp.file("c"), fs::copy_options::recursive);
  const std::string path = tmp.file("c/iter_0000007/__0_0.distcp");  // args.expert_model_parallel_size 1 -> 2
  std::string bytes = testing_util::read_bytes(path);
  const size_t at = bytes.find("expert_model_parallel_size");
  ASSERT_NE(at, std::string::npos);
  const size_t one = bytes.find(std::string("K\x01", 2), at);  // BININT1 1 after the key's memo entry
  ASSERT_LT(one, at + 32);
  bytes[one + 1] = 2;
  testing_util::write_bytes(path, bytes);
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("a torch_dcp checkpoint saved at tensor-parallel size 1 x pipeline-parallel size 1 "
                                      "x expert-parallel size 2: not supported"),
            std::string::npos)
      << m.status().message();
}

TEST(MegatronMoeErrors, MissingExpertRankFileIsNamed) {
  TempDir tmp;
  fs::copy(fixture("moe/torch_tp2ep2"), tmp.file("c"), fs::copy_options::recursive);
  fs::remove_all(tmp.file("c/iter_0000007/mp_rank_01_001"));
  auto m = read_megatron_checkpoint(tmp.file("c"));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("the file of expert-parallel rank 1 of tensor-parallel rank 1, pipeline rank 0 is "
                                      "missing for a checkpoint of 2 expert-parallel ranks"),
            std::string::npos)
      << m.status().message();
}

TEST(MegatronMoeErrors, WrongExpertCountIsNamed) {
  {  // args say 8 experts; the files hold 4 (2 per expert-parallel rank, read as 4 per rank)
    TempDir tmp;
    with_arg(tmp, "moe/torch_ep1", "mp_rank_00", "num_experts", PyValue::integer(8));
    auto m = read_megatron_checkpoint(tmp.file("c"));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("MoE layer 0 has no linear_fc1.weight of expert 4 (args num_experts = 8; found "
                                        "experts 4)"),
              std::string::npos)
        << m.status().message();
  }
  {  // args say 2 experts: the files' expert 2 has no place
    TempDir tmp;
    with_arg(tmp, "moe/torch_ep1", "mp_rank_00", "num_experts", PyValue::integer(2));
    auto m = read_megatron_checkpoint(tmp.file("c"));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("is local expert 2, expected fewer than the 2 experts of each expert-parallel "
                                        "rank"),
              std::string::npos)
        << m.status().message();
  }
  {  // expert TP other than TP in the legacy format (whose EP ranks are then TP ranks: only the files
     // of ranks (TP 0, EP 0) and (TP 1, EP 1) exist): refused before the files are matched up
    TempDir tmp;
    with_arg(tmp, "moe/torch_tp2ep2", "mp_rank_00_000", "expert_tensor_parallel_size", PyValue::integer(1));
    fs::remove_all(tmp.file("c/iter_0000007/mp_rank_00_001"));
    fs::remove_all(tmp.file("c/iter_0000007/mp_rank_01_000"));
    auto m = read_megatron_checkpoint(tmp.file("c"));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("expert_tensor_parallel_size 1 with tensor_model_parallel_size 2 in the torch "
                                        "format: not supported yet"),
              std::string::npos)
        << m.status().message();
  }
}

}  // namespace
}  // namespace gale
