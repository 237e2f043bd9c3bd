// The DPO golden tests' setup: a golden model as policy, its perturbed copy from the reference
// script as the frozen reference model, and the fixture's micro-batch of preference pairs
// (tests/data/golden/dpo_<name>/: fixture.json, reference_weights.safetensors, inputs.safetensors).
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "golden/golden_fixture.h"
#include "model/gpt_model.h"
#include "train/arguments.h"
#include "train/dpo.h"
#include "train/model_setup.h"

namespace gale::golden {

// Every tensor of safetensors file `path`, read as `dtype`.
inline std::map<std::string, Tensor> read_all_tensors(const std::string& path, DType dtype = DType::kF32) {
  auto f = SafetensorsFile::open(path);
  GALE_CHECK(f.ok()) << f.status().to_string();
  std::map<std::string, Tensor> out;
  for (const SafetensorsEntry& e : f.value().entries()) {
    auto t = f.value().read(e.name, dtype);
    GALE_CHECK(t.ok()) << t.status().to_string();
    out[e.name] = t.value();
  }
  return out;
}

struct DpoGoldenRun {
  GoldenFixture f;
  std::string dir;  // tests/data/golden/dpo_<name>
  nlohmann::json fixture;
  Arguments args;
  OpTable ops = reference_ops();
  std::unique_ptr<GPTModel> policy, reference;
  MicroBatch mb;

  // `model`: the golden fixture ("llama", "mixtral"); `dpo_dir`: its DPO fixture directory name.
  DpoGoldenRun(const std::string& model, const std::string& dpo_dir)
      : f(GoldenFixture::load(model).value()), dir(golden_dir() + "/" + dpo_dir) {
    std::ifstream in(dir + "/fixture.json");
    fixture = nlohmann::json::parse(in);
    ArgParser parser{"gale pretrain", "golden"};
    add_all_pretrain_args(parser, args);
    std::vector<std::string> argv = {"gale"};
    argv.insert(argv.end(), f.megatron_args().begin(), f.megatron_args().end());
    for (const char* extra : {"--mock-data", "--eval-iters", "0"}) argv.push_back(extra);
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_CHECK_OK(validate_all_pretrain_args(args, parser, 1));
    args.model.padded_vocab_size = f.model().padded_vocab_size;
    const ModelConfig config = model_config_from_args(args);
    policy = std::make_unique<GPTModel>(config, single_process_partition(config), &ops);
    reference = std::make_unique<GPTModel>(config, single_process_partition(config), &ops);
    load(*policy, f.initial_weights());
    load(*reference, read_all_tensors(dir + "/reference_weights.safetensors"));
    auto file = SafetensorsFile::open(dir + "/inputs.safetensors");
    GALE_CHECK(file.ok()) << file.status().to_string();
    auto ints = [&](const char* name, std::vector<int32_t>* out) {
      Tensor t = file.value().read(name, DType::kI32).value();
      mb.B = t.size(0);
      mb.S = t.size(1);
      out->assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
    };
    ints("tokens", &mb.tokens);
    ints("labels", &mb.labels);
    ints("position_ids", &mb.position_ids);
    Tensor mask = file.value().read("loss_mask", DType::kF32).value();
    mb.loss_mask.assign(mask.data<float>(), mask.data<float>() + mask.numel());
  }

  // Every parameter of `model` from `weights` (name -> tensor), none left out.
  template <typename Weights>
  static void load(GPTModel& model, const Weights& weights) {
    ParamBuffer& pb = model.params();
    int loaded = 0;
    for (const auto& [name, w] : weights) {
      const int id = pb.find(name);
      GALE_CHECK_GE(id, 0) << name;
      pb.param(id).copy_from(w);
      ++loaded;
    }
    GALE_CHECK_EQ(loaded, pb.size());
  }

  static DpoOptions options(const nlohmann::json& c) {
    DpoOptions o;
    o.loss_type = c["loss_type"].get<std::string>();
    o.beta = c["beta"].get<double>();
    o.label_smoothing = c["label_smoothing"].get<double>();
    o.pref_ftx = c["pref_ftx"].get<double>();
    return o;
  }
};

}  // namespace gale::golden
