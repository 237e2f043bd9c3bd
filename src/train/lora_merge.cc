// Reading a LoRA adapter checkpoint and merging it into base weights.
#include "train/lora_merge.h"

#include "model/lora.h"

namespace gale {

namespace {

LoraConfig lora_config_of(const LoraArgs& a) {
  LoraConfig c;
  c.r = a.lora_r;
  c.alpha = static_cast<double>(a.lora_alpha);
  for (const std::string& t : a.lora_target_modules) {
    c.qkv = c.qkv || t == "linear_qkv";
    c.proj = c.proj || t == "linear_proj";
    c.fc1 = c.fc1 || t == "linear_fc1";
    c.fc2 = c.fc2 || t == "linear_fc2";
  }
  return c;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Status validate_lora_merge_args(const LoraArgs& a, const ArgParser& p) {
  Arguments args;  // one process, no MoE: only the LoRA flags' own checks apply
  args.lora = a;
  GALE_RETURN_IF_ERROR(validate_lora_args(args, p));
  if (a.enabled() && a.lora_load.empty())
    return InvalidArgument("--lora-target-modules needs --lora-load (the adapter checkpoint to merge)");
  return Status::Ok();
}

StatusOr<LoraMerge> LoraMerge::open(const LoraArgs& a) {
  GALE_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open(a.lora_load));
  const std::string where = r.directory() + "/metadata.json";
  GALE_ASSIGN_OR_RETURN(nlohmann::json args, r.section("args"));
  if (!args.contains("lora_r"))
    return FailedPrecondition("--lora-load ", a.lora_load, ": ", where,
                              " records no lora_r: not a checkpoint of a LoRA run (gale pretrain --lora-target-modules)");
  if (args["lora_r"].get<int64_t>() != a.lora_r)
    return InvalidArgument("--lora-r ", a.lora_r, " does not match the adapters in ", a.lora_load, " (lora_r ",
                           args["lora_r"].get<int64_t>(), ")");
  if (args["lora_alpha"].get<int64_t>() != a.lora_alpha)
    return InvalidArgument("--lora-alpha ", a.lora_alpha, " does not match the adapters in ", a.lora_load,
                           " (lora_alpha ", args["lora_alpha"].get<int64_t>(), ")");
  const LoraConfig c = lora_config_of(a);
  LoraArgs saved;
  saved.lora_target_modules = args["lora_target_modules"].get<std::vector<std::string>>();
  const LoraConfig s = lora_config_of(saved);
  if (c.qkv != s.qkv || c.proj != s.proj || c.fc1 != s.fc1 || c.fc2 != s.fc2)
    return InvalidArgument("--lora-target-modules does not match the adapters in ", a.lora_load, " (",
                           args["lora_target_modules"].dump(), ")");
  return LoraMerge(std::move(r), c);
}

bool LoraMerge::adapts(const std::string& name) const {
  if (name.rfind("decoder.layers.", 0) != 0) return false;
  return (config_.qkv && ends_with(name, ".self_attention.linear_qkv.weight")) ||
         (config_.proj && ends_with(name, ".self_attention.linear_proj.weight")) ||
         (config_.fc1 && ends_with(name, ".mlp.linear_fc1.weight")) ||
         (config_.fc2 && ends_with(name, ".mlp.linear_fc2.weight"));
}

Status LoraMerge::merge_into(const std::string& name, Tensor& w) const {
  GALE_CHECK(w.ndim() == 2 && w.dtype() == DType::kF32) << name;
  const int64_t out = w.size(0), in = w.size(1);
  GALE_ASSIGN_OR_RETURN(Tensor a, reader_.read(lora_a_name(name), {config_.r, in}, DType::kF32));
  GALE_ASSIGN_OR_RETURN(Tensor b, reader_.read(lora_b_name(name), {out, config_.r}, DType::kF32));
  LoraWeights l;
  l.a = a.data<float>();
  l.b = b.data<float>();
  l.r = config_.r;
  l.out = out;
  l.in = in;
  l.scaling = config_.scaling();
  lora_merge(w.data<float>(), l);
  return Status::Ok();
}

}  // namespace gale
