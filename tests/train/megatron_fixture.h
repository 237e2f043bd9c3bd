// The Megatron fixtures of tests/data/megatron/ (reference.json's logits) and Gale's forward on a loaded checkpoint.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/model_checkpoint.h"
#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "train/megatron_checkpoint.h"
#include "train/model_setup.h"

namespace gale::megatron_fixture {

using testing_util::TempDir;

constexpr double kLogitTolerance = 1e-4;

inline std::string fixture(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/megatron/" + name; }

struct Reference {
  std::vector<int32_t> tokens, labels;
  std::vector<std::vector<double>> logits;  // [S][Vp]
  std::vector<double> losses;
};

inline Reference read_reference(const std::string& name = "reference.json") {
  std::ifstream in(fixture(name));
  const nlohmann::json j = nlohmann::json::parse(in);
  Reference r;
  r.tokens = j["tokens"].get<std::vector<int32_t>>();
  r.labels = j["labels"].get<std::vector<int32_t>>();
  r.logits = j["logits"].get<std::vector<std::vector<double>>>();
  r.losses = j["losses"].get<std::vector<double>>();
  return r;
}

// Gale's model of `m`, its parameters taken from m.tensors.
struct LoadedModel {
  ModelConfig config;
  OpTable ops = reference_ops();
  std::unique_ptr<GPTModel> model;
};
inline std::unique_ptr<LoadedModel> build_model(const MegatronCheckpoint& m) {
  TempDir tmp;
  EXPECT_TRUE(save_megatron_as_gale(m, tmp.file("gale"), "fixture").ok());
  auto r = CheckpointReader::open(tmp.file("gale"));
  EXPECT_TRUE(r.ok()) << r.status().message();
  Arguments a;
  a.model = m.model;
  a.moe = m.moe;
  auto out = std::make_unique<LoadedModel>();
  out->config = model_config_from_args(a);
  out->model = std::make_unique<GPTModel>(out->config, single_process_partition(out->config), &out->ops);
  Status s = load_parameters(r.value(), out->model->params());
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

// Largest |Gale - Megatron| over all padded logits, and the largest per-token loss difference.
struct Comparison {
  double max_logit_diff = 0, max_loss_diff = 0;
};
inline Comparison compare(GPTModel& model, const Reference& ref) {
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ref.tokens.size());
  mb.tokens = ref.tokens;
  mb.position_ids.resize(ref.tokens.size());
  std::iota(mb.position_ids.begin(), mb.position_ids.end(), 0);
  Tensor logits = model.forward_logits(mb, Tensor());  // [1, S, Vp]
  const int64_t Vp = logits.size(2);
  Comparison c;
  for (int64_t s = 0; s < mb.S; ++s) {
    const float* row = logits.data<float>() + s * Vp;
    EXPECT_EQ(static_cast<size_t>(Vp), ref.logits[s].size());
    for (int64_t v = 0; v < Vp; ++v) c.max_logit_diff = std::max(c.max_logit_diff, std::abs(row[v] - ref.logits[s][v]));
    double mx = *std::max_element(row, row + Vp), sum = 0;  // Megatron's loss is over the padded vocabulary
    for (int64_t v = 0; v < Vp; ++v) sum += std::exp(row[v] - mx);
    const double loss = mx + std::log(sum) - row[ref.labels[s]];
    c.max_loss_diff = std::max(c.max_loss_diff, std::abs(loss - ref.losses[s]));
  }
  return c;
}

inline bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Writes every tensor of `m` in Megatron's torch format with `o`, at the fixtures' iteration 7 and
// vocabulary of 50 (the writers' tests compare the result with the fixtures' rank files).
inline Status write_fixture_as_megatron(const MegatronCheckpoint& m, MegatronSaveOptions o) {
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : m.tensors) tensors.push_back({name, t});
  o.iteration = 7;
  o.vocab_size = 50;
  return write_megatron_checkpoint(o, m.model, tensors);
}

// Compares the torch-format rank file `mine` (a Gale-written model_optim_rng.pt) with Megatron's
// `theirs`: the same model keys, kinds and tensor bytes (`_extra_state` entries included); then
// `check_args(mine's args, theirs)`.
inline void expect_same_rank_file(const std::string& mine, const std::string& theirs,
                                  const std::function<void(const PyValue&, const PyValue&)>& check_args) {
  SCOPED_TRACE(theirs);
  auto a_root = read_torch_file(mine);
  auto b_root = read_torch_file(theirs);
  ASSERT_TRUE(a_root.ok() && b_root.ok()) << a_root.status().message() << " " << b_root.status().message();
  const PyValue* a = (*a_root)->get("model");
  const PyValue* b = (*b_root)->get("model");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->entries.size(), b->entries.size());
  for (const auto& [k, v] : b->entries) {
    const PyValue* x = a->get(k->s);
    ASSERT_TRUE(x != nullptr) << k->s;
    ASSERT_EQ(x->kind, v->kind) << k->s;
    if (v->kind == PyValue::kTensor) EXPECT_TRUE(same_tensor(x->data, v->data)) << k->s;
  }
  const PyValue* args = (*a_root)->get("args");
  const PyValue* want = (*b_root)->get("args");
  ASSERT_TRUE(args && want);
  check_args(*args, *want);
}

}  // namespace gale::megatron_fixture
