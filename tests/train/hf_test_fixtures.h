// Shared helpers of the `gale convert` fixture tests (tests/train/hf_convert*_test.cc): the fixtures under
// tests/data/hf, their golden logits, a converted checkpoint's model and its logits, damaged copies.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/model_checkpoint.h"
#include "ckpt/safetensors.h"
#include "ckpt/temp_dir.h"
#include "kernels/op_table.h"
#include "model/gpt_model.h"
#include "train/checkpoint_args.h"
#include "train/hf_convert.h"
#include "train/model_setup.h"

namespace gale {
namespace testing_hf {

using testing_util::TempDir;

// Gale's logits after import against transformers' (fp32 compute on both sides).
inline constexpr double kLogitTolerance = 1e-4;

inline std::string fixture(const std::string& name) { return std::string(GALE_TEST_DATA_DIR) + "/hf/" + name; }
inline void quiet(const std::string&) {}

inline HfToGaleOptions to_gale(const std::string& load, const std::string& save, int64_t divisible_by = 128, int64_t tp = 1) {
  HfToGaleOptions o;
  o.load_dir = load;
  o.save_dir = save;
  o.make_vocab_size_divisible_by = divisible_by;
  o.target_tensor_parallel_size = tp;
  return o;
}

inline GaleToHfOptions to_hf(const std::string& load, const std::string& save, const std::string& dtype = "fp32") {
  GaleToHfOptions o;
  o.load_dir = load;
  o.save_dir = save;
  o.save_dtype = dtype;
  return o;
}

struct Golden {
  std::vector<int32_t> tokens;
  Tensor logits;  // [S, V]
  float loss = 0;
};

inline Golden read_golden(const std::string& name) {
  auto f = SafetensorsFile::open(fixture(name) + "/golden.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().message();
  Golden g;
  Tensor tokens = f->read("tokens", DType::kI64).value();
  for (int64_t i = 0; i < tokens.numel(); ++i) g.tokens.push_back(static_cast<int32_t>(tokens.data<int64_t>()[i]));
  g.logits = f->read("logits", DType::kF32).value();
  g.loss = f->read("loss", DType::kF32).value().data<float>()[0];
  return g;
}

// Gale's model built from the checkpoint's own args, with its parameters loaded.
struct LoadedModel {
  ModelConfig config;
  OpTable ops = reference_ops();
  std::unique_ptr<GPTModel> model;
};
// `edit_args` (optional) changes the recorded args before the model is built.
inline std::unique_ptr<LoadedModel> load_model(const std::string& ckpt,
                                               const std::function<void(nlohmann::json&)>& edit_args = nullptr) {
  auto r = CheckpointReader::open(ckpt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  nlohmann::json args = r->section("args").value();
  if (edit_args) edit_args(args);
  auto m = model_args_from_json(args, ckpt);
  EXPECT_TRUE(m.ok()) << m.status().message();
  auto moe = moe_args_from_json(args, ckpt, m->num_layers);
  EXPECT_TRUE(moe.ok()) << moe.status().message();
  Arguments a;
  a.model = m.value();
  a.moe = moe.value();
  auto out = std::make_unique<LoadedModel>();
  out->config = model_config_from_args(a);
  out->model = std::make_unique<GPTModel>(out->config, single_process_partition(out->config), &out->ops);
  Status s = load_parameters(r.value(), out->model->params());
  EXPECT_TRUE(s.ok()) << s.message();
  return out;
}

inline Tensor logits_of(GPTModel& model, const std::vector<int32_t>& tokens) {
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(tokens.size());
  mb.tokens = tokens;
  mb.position_ids.resize(tokens.size());
  std::iota(mb.position_ids.begin(), mb.position_ids.end(), 0);
  return model.forward_logits(mb, Tensor());  // [1, S, Vp]
}

// Largest |Gale - HF| over the real vocabulary, and the causal-LM loss over it (as transformers).
struct Comparison {
  double max_diff = 0, loss = 0;
};
inline Comparison compare(const Tensor& gale, const Golden& g) {
  const int64_t S = g.logits.size(0), V = g.logits.size(1), Vp = gale.size(2);
  Comparison c;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t v = 0; v < V; ++v)
      c.max_diff = std::max(c.max_diff, std::abs(static_cast<double>(gale.data<float>()[s * Vp + v]) -
                                                 g.logits.data<float>()[s * V + v]));
  for (int64_t s = 0; s + 1 < S; ++s) {
    const float* row = gale.data<float>() + s * Vp;
    double mx = *std::max_element(row, row + V), sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
    c.loss += mx + std::log(sum) - row[g.tokens[s + 1]];
  }
  c.loss /= static_cast<double>(S - 1);
  return c;
}

// A copy of a fixture to damage.
inline std::string copy_fixture(const TempDir& tmp, const std::string& name) {
  const std::string dst = tmp.file(name);
  std::filesystem::copy(fixture(name), dst, std::filesystem::copy_options::recursive);
  return dst;
}

inline void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  {
    std::ifstream in(dir + "/config.json");
    j = nlohmann::json::parse(in);
  }
  edit(j);
  std::ofstream(dir + "/config.json") << j.dump(2);
}

inline std::string error_of(const std::string& dir, const TempDir& tmp) {
  Status s = convert_hf_to_gale(to_gale(dir, tmp.file("out")), quiet);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(tmp.file("out/latest_checkpointed_iteration.txt")));  // nothing committed
  return s.message();
}

// A JSON file (a fixture's or a converted checkpoint's config.json).
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Every tensor of a safetensors file, read as f32.
inline std::map<std::string, Tensor> tensors_of(const std::string& file) {
  auto f = SafetensorsFile::open(file);
  EXPECT_TRUE(f.ok()) << f.status().message();
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : f->entries()) out[e.name] = f->read(e.name, DType::kF32).value();
  return out;
}

// Hugging Face checkpoint `hf_dir` -> Megatron's format at tensor-parallel size `tp` (`tmp`/mg) -> Gale
// (`tmp`/gale), as `gale convert` does with --save-model-type mg, then --load-model-type mg.
inline Status hf_through_megatron(const std::string& hf_dir, const TempDir& tmp, int64_t tp) {
  MegatronConvertOptions mg;
  mg.from = ModelFormat::kHf;
  mg.to = ModelFormat::kMegatron;
  mg.load_dir = hf_dir;
  mg.save_dir = tmp.file("mg");
  mg.target_tensor_parallel_size = tp;
  GALE_RETURN_IF_ERROR(convert_megatron(mg, quiet));
  mg.from = ModelFormat::kMegatron;
  mg.to = ModelFormat::kGale;
  mg.load_dir = tmp.file("mg");
  mg.save_dir = tmp.file("gale");
  return convert_megatron(mg, quiet);
}

}  // namespace testing_hf
}  // namespace gale
