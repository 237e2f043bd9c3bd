// Megatron-LM main's --dump-param-to-param-group-map: the group keys, their numbering, and the DCP directory.
#include "train/param_group_map.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "ckpt/atomic_file.h"
#include "ckpt/dcp_reader.h"
#include "ckpt/pickle.h"
#include "ckpt/torch_file.h"
#include "core/log.h"
#include "model/gpt_model.h"
#include "train/engine.h"

namespace gale {

namespace {

const char* const kFlag = "--dump-param-to-param-group-map";
const char* const kDcp = "torch.distributed.checkpoint.metadata.";

// SequentialMLP's `mlp.experts.local_experts.<e>.linear_fcN.weight` as TEGroupedMLP's `mlp.experts.linear_fcN.weight<e>`.
std::string grouped_gemm_name(const std::string& name) {
  const std::string marker = "mlp.experts.local_experts.";
  const size_t at = name.find(marker);
  if (at == std::string::npos) return name;
  const size_t num = at + marker.size();
  const size_t dot = name.find('.', num);
  if (dot == std::string::npos) return name;
  const std::string expert = name.substr(num, dot - num);
  const std::string rest = name.substr(dot + 1);  // linear_fc1.weight
  if (rest != "linear_fc1.weight" && rest != "linear_fc2.weight" && rest != "linear_fc1.bias" &&
      rest != "linear_fc2.bias")
    return name;
  return name.substr(0, at) + "mlp.experts." + rest + expert;
}

std::string encode_key(const ParamGroupKey& k) {
  std::ostringstream o;
  o.precision(17);
  o << (k.expert_parallel ? 1 : 0);
  for (const auto& [name, value] : k.overrides) o << ' ' << name << ' ' << value;
  return o.str();
}

ParamGroupKey decode_key(const std::string& s) {
  std::istringstream in(s);
  ParamGroupKey k;
  int expert = 0;
  in >> expert;
  k.expert_parallel = expert != 0;
  std::string name;
  double value = 0;
  while (in >> name >> value) k.overrides.emplace_back(name, value);
  return k;
}

// Every rank's bytes, in rank order.
std::vector<std::string> all_gather_bytes(const Comm& world, const std::string& mine) {
  const int n = world->size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(n));
  world->all_gather(&len, lens.data(), 1, DType::kI64);
  const int64_t longest = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::string padded = mine;
  padded.resize(static_cast<size_t>(longest), '\0');
  std::string all(static_cast<size_t>(longest * n), '\0');
  world->all_gather(padded.data(), all.data(), longest, DType::kU8);
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r)
    out.push_back(all.substr(static_cast<size_t>(r * longest), static_cast<size_t>(lens[static_cast<size_t>(r)])));
  return out;
}

PyRef obj(const std::string& cls, std::vector<std::pair<std::string, PyRef>> fields) {
  PyRef state = PyValue::dict();
  for (auto& [k, v] : fields) state->set(k, std::move(v));
  return PyValue::object(cls, state);
}

}  // namespace

bool param_group_key_less(const ParamGroupKey& a, const ParamGroupKey& b) {
  const bool a_none = a.overrides.empty(), b_none = b.overrides.empty();
  if (a_none != b_none) return a_none;  // None first
  return a.overrides < b.overrides;     // Python's tuple order of (name, value) pairs
}

Status check_param_group_map_args(const Arguments& a) {
  if (a.training.dump_param_to_param_group_map.empty()) return Status::Ok();
  if (a.model.use_mup)
    return Unimplemented(kFlag, " with --use-mup: not supported yet (µP's learning-rate overrides make groups of their own)");
  if (a.training.optimizer != "adam" && a.training.optimizer != "sgd")
    return InvalidArgument(kFlag, ": Megatron writes the map only for --optimizer adam or sgd, found ",
                           a.training.optimizer);
  if (a.parallel.use_custom_fsdp)
    return InvalidArgument(kFlag, ": Megatron writes no map with Megatron-FSDP (--use-custom-fsdp)");
  if (a.parallel.use_torch_fsdp2 || a.parallel.layerzero)
    return Unimplemented(kFlag, " with --use-torch-fsdp2 or --layerzero: not supported yet");
  if (a.parallel.overlap_param_gather_with_optimizer_step)
    return Unimplemented(kFlag, " with --overlap-param-gather-with-optimizer-step: not supported yet (Megatron "
                                "numbers the first model chunk's groups separately there)");
  return Status::Ok();
}

std::string megatron_param_group_name(const GPTModel& model, int id, const Arguments& args) {
  const ParamSpec& s = model.params().spec(id);
  std::string name = s.whole_model_name();
  // The last pipeline stage's copy of the tied embedding is Megatron's output_layer.weight there.
  if (id == model.output_weight_id() && id != model.word_embedding_id()) name = "output_layer.weight";
  if (args.moe.moe_grouped_gemm) name = grouped_gemm_name(name);
  const bool float16 = args.training.bf16 || args.training.fp16;
  return std::string(float16 ? "module.module." : "module.") + name;
}

std::vector<std::pair<std::string, ParamGroupKey>> param_group_keys(const GPTModel& model, const Arguments& args) {
  const ParamBuffer& pb = model.params();
  const std::vector<bool> qk_decay =
      args.training.apply_wd_to_qk_layernorm ? qk_layernorm_weight_decay(model) : std::vector<bool>{};
  const bool decoupled = !std::isnan(args.training.decoupled_lr);
  std::vector<std::pair<std::string, ParamGroupKey>> out;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (!s.trainable || s.buffer || s.fp8_state_buffer) continue;  // requires_grad False, or not a parameter
    ParamGroupKey k;
    k.expert_parallel = s.expert_parallel;
    // The engine's rules (train/engine.cc): the decoupled rate on the word embedding and the output layer,
    // no weight decay where ParamSpec::weight_decay (or --apply-wd-to-qk-layernorm's rule) says so.
    if (decoupled && (id == model.word_embedding_id() || id == model.output_weight_id())) {
      k.overrides.emplace_back("max_lr", args.training.decoupled_lr);
      if (!std::isnan(args.training.decoupled_min_lr)) k.overrides.emplace_back("min_lr", args.training.decoupled_min_lr);
    }
    const bool decays = qk_decay.empty() ? s.weight_decay : static_cast<bool>(qk_decay[static_cast<size_t>(id)]);
    if (!decays) k.overrides.emplace_back("wd_mult", 0.0);
    std::sort(k.overrides.begin(), k.overrides.end());
    out.emplace_back(megatron_param_group_name(model, id, args), std::move(k));
  }
  return out;
}

ParamGroupMap assign_param_groups(const std::vector<std::pair<std::string, ParamGroupKey>>& all) {
  std::vector<ParamGroupKey> keys;
  for (const auto& [name, k] : all)
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  std::stable_sort(keys.begin(), keys.end(), param_group_key_less);
  // The dense groups first, then the expert-parallel ones (separate optimizers, one running count).
  std::vector<ParamGroupKey> order;
  for (bool expert : {false, true})
    for (const ParamGroupKey& k : keys)
      if (k.expert_parallel == expert) order.push_back(k);
  ParamGroupMap map;
  for (const auto& [name, k] : all)
    map[name] = std::find(order.begin(), order.end(), k) - order.begin();
  return map;
}

Status write_param_group_map(const std::string& dir, const ParamGroupMap& map) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IOError(kFlag, " ", dir, ": cannot create the directory (", ec.message(), ")");
  const std::string file = "__0_0.distcp";
  std::string data;
  PyRef sd_meta = PyValue::dict(), storage = PyValue::dict();
  for (const auto& [name, group] : map) {
    GALE_ASSIGN_OR_RETURN(std::string bytes, write_torch_bytes(*PyValue::integer(group), "archive"));
    PyRef index = obj(std::string(kDcp) + "MetadataIndex",
                      {{"fqn", PyValue::str(name)}, {"offset", PyValue::none()}, {"index", PyValue::none()}});
    PyRef info = obj("torch.distributed.checkpoint.filesystem._StorageInfo",
                     {{"relative_path", PyValue::str(file)},
                      {"offset", PyValue::integer(static_cast<int64_t>(data.size()))},
                      {"length", PyValue::integer(static_cast<int64_t>(bytes.size()))}});
    storage->entries.emplace_back(index, info);
    sd_meta->set(name, PyValue::object(std::string(kDcp) + "BytesStorageMetadata", PyValue::dict()));
    data += bytes;
  }
  PyRef metadata = obj(std::string(kDcp) + "Metadata", {{"state_dict_metadata", sd_meta},
                                                        {"planner_data", PyValue::none()},
                                                        {"storage_data", storage}});
  std::vector<const PyValue*> tensors;
  GALE_ASSIGN_OR_RETURN(std::string pickle, write_pickle(*metadata, &tensors));
  GALE_RETURN_IF_ERROR(write_file_atomically(dir + "/" + file, data));
  return write_file_atomically(dir + "/.metadata", pickle);
}

StatusOr<ParamGroupMap> read_param_group_map(const std::string& dir) {
  GALE_ASSIGN_OR_RETURN(DcpCheckpoint c, DcpCheckpoint::open(dir));
  if (!c.tensors().empty())
    return DataLoss(dir, ": expected a parameter -> param-group map (objects only), found tensor '",
                    c.tensors().begin()->first, "'");
  ParamGroupMap map;
  for (const auto& [name, chunk] : c.objects()) {
    GALE_ASSIGN_OR_RETURN(PyRef v, c.read_object(name));
    if (v->kind != PyValue::kInt)
      return DataLoss(dir, ": '", name, "': expected a param-group index (an int), found ", v->type_name());
    map[name] = v->i;
  }
  return map;
}

Status dump_param_group_map(const Engine& engine, const Arguments& args, const Comm& world) {
  const std::string& dir = args.training.dump_param_to_param_group_map;
  if (dir.empty()) return Status::Ok();
  GALE_RETURN_IF_ERROR(check_param_group_map_args(args));
  if (args.training.skip_train || !engine.optimizer) {  // Megatron builds no optimizer, hence no map
    print_rank0(str_cat(" > ", kFlag, ": no optimizer is built (--skip-train): no map written"));
    return Status::Ok();
  }
  std::string mine;
  for (const auto& chunk : engine.chunks)
    for (const auto& [name, key] : param_group_keys(*chunk, args)) mine += name + '\t' + encode_key(key) + '\n';
  const std::vector<std::string> ranks = all_gather_bytes(world, mine);
  Status st = Status::Ok();
  if (world->rank() == 0) {
    std::vector<std::pair<std::string, ParamGroupKey>> all;
    for (const std::string& r : ranks) {
      std::istringstream in(r);
      for (std::string line; std::getline(in, line);) {
        const size_t tab = line.find('\t');
        all.emplace_back(line.substr(0, tab), decode_key(line.substr(tab + 1)));
      }
    }
    const ParamGroupMap map = assign_param_groups(all);
    st = write_param_group_map(dir, map);
    if (st.ok()) {
      int64_t groups = 0;
      for (const auto& [name, g] : map) groups = std::max(groups, g + 1);
      print_rank0(str_cat(" > wrote the parameter -> param-group map (", map.size(), " parameters, ", groups,
                          " groups) to ", dir));
    }
  }
  // Every rank returns rank 0's result.
  int64_t ok = st.ok() ? 1 : 0;
  world->broadcast(&ok, 1, DType::kI64, 0);
  if (world->rank() == 0) return st;
  return ok ? Status::Ok() : IOError(kFlag, " ", dir, ": rank 0 could not write the map");
}

}  // namespace gale
