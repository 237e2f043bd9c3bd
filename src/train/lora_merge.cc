// Reading a LoRA adapter checkpoint and merging it into base weights.
#include "train/lora_merge.h"

#include <cstring>

#include "ckpt/checkpoint_writer.h"
#include "comm/communicator.h"
#include "model/lora.h"
#include "model/lora_modules.h"

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
    c.in_proj = c.in_proj || t == "in_proj";
    c.out_proj = c.out_proj || t == "out_proj";
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
  // The model is the checkpoint's, not these flags': in_proj / out_proj pass the GDN-model rule here
  // (the adapter checkpoint, whose recorded targets LoraMerge::open checks, comes from a GDN run).
  args.model.experimental_attention_variant = "gdn";
  args.model.untie_embeddings_and_output_weights = true;  // output_layer: the checkpoint's model decides
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
  if (c.qkv != s.qkv || c.proj != s.proj || c.fc1 != s.fc1 || c.fc2 != s.fc2 || c.in_proj != s.in_proj ||
      c.out_proj != s.out_proj)
    return InvalidArgument("--lora-target-modules does not match the adapters in ", a.lora_load, " (",
                           args["lora_target_modules"].dump(), ")");
  // --lora-modules-to-save: the checkpoint's record decides (the flag, when given, must agree).
  std::vector<std::string> modules;
  if (args.contains("lora_modules_to_save")) modules = args["lora_modules_to_save"].get<std::vector<std::string>>();
  if (!a.lora_modules_to_save.empty() &&
      std::set<std::string>(a.lora_modules_to_save.begin(), a.lora_modules_to_save.end()) !=
          std::set<std::string>(modules.begin(), modules.end()))
    return InvalidArgument("--lora-modules-to-save does not match the modules saved in ", a.lora_load, " (",
                           nlohmann::json(modules).dump(), ")");
  std::set<std::string> whole;
  for (const std::string& name : r.tensor_names())
    if (name.rfind("optimizer.", 0) != 0 && lora_saves_module(modules, name)) whole.insert(name);
  if (!modules.empty() && whole.empty())
    return FailedPrecondition("--lora-load ", a.lora_load, " records lora_modules_to_save ",
                              nlohmann::json(modules).dump(), " but holds none of their tensors");
  return LoraMerge(std::move(r), c, std::move(whole));
}

bool LoraMerge::adapts(const std::string& name) const {
  if (saved_.count(name)) return true;
  if (name.rfind("decoder.layers.", 0) != 0) return false;
  return (config_.qkv && ends_with(name, ".self_attention.linear_qkv.weight")) ||
         (config_.proj && ends_with(name, ".self_attention.linear_proj.weight")) ||
         (config_.fc1 && ends_with(name, ".mlp.linear_fc1.weight")) ||
         (config_.fc2 && ends_with(name, ".mlp.linear_fc2.weight")) ||
         // the routed experts' (model/lora_expert.h), by global expert
         (config_.fc1 && name.find(".mlp.experts.local_experts.") != std::string::npos &&
          ends_with(name, ".linear_fc1.weight")) ||
         (config_.fc2 && name.find(".mlp.experts.local_experts.") != std::string::npos &&
          ends_with(name, ".linear_fc2.weight")) ||
         // the MoE shared experts' (model/moe_shared_expert.h)
         (config_.fc1 && ends_with(name, ".mlp.shared_experts.linear_fc1.weight")) ||
         (config_.fc2 && ends_with(name, ".mlp.shared_experts.linear_fc2.weight")) ||
         (config_.in_proj && ends_with(name, ".self_attention.in_proj.weight")) ||  // Gated DeltaNet's
         (config_.out_proj && ends_with(name, ".self_attention.out_proj.weight"));
}

Status LoraMerge::merge_into(const std::string& name, Tensor& w) const {
  if (saved_.count(name)) {  // a module trained whole: the checkpoint's tensor replaces the base's
    GALE_CHECK(w.dtype() == DType::kF32) << name;
    GALE_ASSIGN_OR_RETURN(Tensor t, reader_.read(name, w.shape(), DType::kF32));
    std::memcpy(w.data<float>(), t.data<float>(), t.nbytes());
    return Status::Ok();
  }
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

Status merge_lora_checkpoint(const std::string& load_dir, const std::string& save_dir, const LoraArgs& a,
                             const std::function<void(const std::string&)>& log) {
  GALE_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open(load_dir));
  GALE_ASSIGN_OR_RETURN(LoraMerge merge, LoraMerge::open(a));
  log(str_cat("merging the LoRA adapters of ", merge.directory(), " (r ", a.lora_r, ", alpha ", a.lora_alpha,
              ") into ", r.directory()));
  Comm self = make_self_communicator("world");
  CheckpointWriter w(save_dir, 0, *self);
  std::vector<Tensor> keep;  // the writer references the data until commit()
  int merged = 0;
  for (const std::string& name : r.tensor_names()) {
    if (name.rfind("optimizer.", 0) == 0) continue;  // a merged base starts a new run
    if (name.find(".lora_") != std::string::npos)
      return FailedPrecondition("--load-dir ", load_dir, " holds LoRA adapter '", name,
                                "': expected the base checkpoint the adapters were trained on");
    GALE_ASSIGN_OR_RETURN(Shape shape, r.global_shape(name));
    GALE_ASSIGN_OR_RETURN(Tensor t, r.read(name, shape, DType::kF32));
    if (merge.adapts(name)) {
      GALE_RETURN_IF_ERROR(merge.merge_into(name, t));
      ++merged;
    }
    keep.push_back(t);
    GALE_RETURN_IF_ERROR(w.add(name, t));
  }
  nlohmann::json sections;
  sections["gale_trainer_state_version"] = 1;
  for (const char* key : {"model", "args"}) {
    GALE_ASSIGN_OR_RETURN(nlohmann::json section, r.section(key));
    sections[key] = section;
  }
  sections["trainer"] = {{"iteration", 0},
                         {"consumed_train_samples", 0},
                         {"consumed_valid_samples", 0},
                         {"num_floating_point_operations_so_far", 0.0}};
  sections["lora_merged"] = {{"base", r.directory()},
                             {"adapters", merge.directory()},
                             {"lora_r", a.lora_r},
                             {"lora_alpha", a.lora_alpha},
                             {"lora_target_modules", a.lora_target_modules}};
  GALE_RETURN_IF_ERROR(w.commit(sections));
  log(str_cat("saved ", keep.size(), " tensors (", merged, " merged) to ", w.final_dir()));
  return Status::Ok();
}

}  // namespace gale
