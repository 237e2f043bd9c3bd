// A Hugging Face model directory on disk: config.json and the safetensors weights (one file, or shards with an index).
//
//   GALE_ASSIGN_OR_RETURN(HfFiles hf, HfFiles::open("llama-7b/"));
//   const nlohmann::json& config = hf.config();
//   GALE_ASSIGN_OR_RETURN(Tensor w, hf.read("model.embed_tokens.weight", {32000, 4096}));   // f32
//   for (const std::string& name : hf.unread()) ...;   // tensors no read() asked for
//
// Weights are model.safetensors, or model-0000k-of-0000n.safetensors listed by
// model.safetensors.index.json ("weight_map": tensor -> file). F32, F16 and BF16 (and F64) tensors
// are read as f32, exactly. Every error names the file and the tensor.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

class HfFiles {
 public:
  // NotFound when `dir` has no config.json, or neither model.safetensors nor
  // model.safetensors.index.json (a pytorch_model.bin-only directory is named as such).
  static StatusOr<HfFiles> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  const nlohmann::json& config() const { return config_; }
  // All tensor names, sorted.
  std::vector<std::string> names() const;

  // The tensor `name` as f32 with exactly `shape`: NotFound when absent, FailedPrecondition
  // ("FILE: tensor 'x' has shape [a, b], expected [c, d]") for another shape. A name starting
  // "transformer." is also found without that prefix (GPT-2 files saved from GPT2Model).
  StatusOr<Tensor> read(const std::string& name, const Shape& shape);
  // Whether the weights hold `name`.
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // The safetensors file that holds `name` (the directory when none does), for error messages.
  std::string file_of(const std::string& name) const;
  // Names of tensors no read() has returned, sorted.
  std::vector<std::string> unread() const;
  // Whether every floating-point tensor is stored as BF16 (then bf16 holds all of them exactly).
  bool all_bf16() const;

 private:
  struct Location {
    int file;
    const SafetensorsEntry* entry;
  };
  std::string dir_, config_path_;
  nlohmann::json config_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Location> tensors_;
  std::set<std::string> read_;
};

}  // namespace gale
