// Megatron's legacy `torch` checkpoints <-> Gale's whole tensors: merging and cutting the TP/PP pieces.
#include "train/megatron_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ckpt/atomic_file.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/safetensors_dtype.h"
#include "ckpt/torch_file.h"
#include "comm/communicator.h"
#include "train/checkpoint_args.h"
#include "train/megatron_dist_checkpoint.h"
#include "train/megatron_gdn_dist.h"
#include "train/megatron_gdn_names.h"
#include "train/megatron_mla_names.h"
#include "train/megatron_moe_names.h"
#include "train/megatron_mtp_names.h"
#include "train/megatron_tp_split.h"
#include "train/megatron_torch_optimizer.h"
#include "train/model_setup.h"

namespace gale {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "decoder.layers.<i>.<rest>": i and rest; false for other names.
bool layer_of(const std::string& name, int64_t* index, std::string* rest) {
  static const std::string kPrefix = "decoder.layers.";
  if (name.rfind(kPrefix, 0) != 0) return false;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return false;
  const std::string digits = name.substr(kPrefix.size(), dot - kPrefix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return false;
  *index = std::stoll(digits);
  *rest = name.substr(dot + 1);
  return true;
}

// Transformer Engine's fused-norm names -> the local spec's (Gale's).
std::string local_name(const std::string& rest) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
      {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
      {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"}};
  for (const auto& [te, local] : kRenames)
    if (rest == te) return local;
  return rest;
}

// A torch-format name whose layers are numbered from `offset` -> Gale's: the global layer number and
// the local spec's norm names (those of an MTP layer's inner transformer_layer too, Megatron main's
// mtp_model_layer read as transformer_layer). `te_names`: Transformer Engine's fused norm names kept
// (a Gated DeltaNet model's layers, which Gale names as Megatron does: train/megatron_gdn_names.h).
std::string gale_name_te(const std::string& name, int64_t offset, bool te_names) {
  int64_t i;
  std::string rest;
  if (layer_of(name, &i, &rest)) return str_cat("decoder.layers.", offset + i, ".", te_names ? rest : local_name(rest));
  static const std::string kInner = "transformer_layer.";
  if (megatron_mtp_layer_of(name, &i, &rest))
    return rest.rfind(kInner, 0) == 0 ? str_cat("mtp.layers.", i, ".", kInner, local_name(rest.substr(kInner.size())))
                                      : str_cat("mtp.layers.", i, ".", rest);
  return name;
}
std::string gale_name_of(const std::string& name, int64_t offset) { return gale_name_te(name, offset, false); }

// Megatron's optimizer state tensors (torch-format names) -> Gale's names in m.optimizer; the fp32
// master copies replace the model weights in m.tensors.
Status take_optimizer_state(MegatronOptimizerState o, MegatronCheckpoint& m) {
  std::map<std::string, std::map<std::string, Tensor>> named;
  const bool tied = !m.args.value("untie_embeddings_and_output_weights", false);
  for (auto& [state, by_name] : o.tensors)
    for (auto& [name, t] : by_name) {
      if (ends_with(name, "_extra_state")) continue;
      const std::string g = gale_name_of(name, 0);
      if (tied && g == "output_layer.weight") continue;
      auto w = m.tensors.find(g);
      if (w == m.tensors.end())
        return DataLoss(m.directory, ": optimizer state '", state, "' of '", name, "': the model holds no such tensor");
      if (t.shape() != w->second.shape())
        return DataLoss(m.directory, ": optimizer state '", state, "' of '", name, "' has shape ", t.shape_string(),
                        ", the model tensor ", w->second.shape_string());
      Tensor f = t;
      if (t.dtype() != DType::kF32) {
        f = Tensor::empty(t.shape(), DType::kF32);
        GALE_RETURN_IF_ERROR(convert_elements(st_dtype_of(t.dtype()), t.raw(), DType::kF32, f.raw(), t.numel(), name));
      }
      if (state == "fp32_param") {
        w->second = std::move(f);  // Megatron's master copy: the weights it trains on
        o.fp32_masters = true;
      } else {
        named[state][g] = std::move(f);
      }
    }
  o.tensors = std::move(named);
  // torch's SGD keeps no step: with momentum buffers saved, the steps taken are the iterations (so
  // that Gale's first step does not start the buffers afresh).
  if (o.step == 0 && o.tensors.count("momentum_buffer")) o.step = m.iteration;
  m.optimizer = std::move(o);
  return Status::Ok();
}

// Whether Gale's GPT model has a place for `name` (a merged, global name) whose TP layout megatron_split_of
// knows: dense and MoE layers (train/megatron_moe_names.h), with `mla` multi-latent attention's too,
// with `gdn` Gated DeltaNet's (train/megatron_gdn_names.h); anything else (Mamba, ...) would be merged
// wrongly or dropped silently.
bool known_tensor(const std::string& name, bool mla, bool gdn = false) {
  static const std::set<std::string> kTop = {"embedding.word_embeddings.weight", "embedding.position_embeddings.weight",
                                             "decoder.final_layernorm.weight", "decoder.final_layernorm.bias",
                                             "output_layer.weight"};
  static const std::set<std::string> kLayer = {
      "input_layernorm.weight",           "input_layernorm.bias",           "self_attention.linear_qkv.weight",
      "self_attention.linear_qkv.bias",   "self_attention.linear_proj.weight", "self_attention.linear_proj.bias",
      "self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight", "pre_mlp_layernorm.weight",
      "pre_mlp_layernorm.bias",           "mlp.linear_fc1.weight",          "mlp.linear_fc1.bias",
      "mlp.linear_fc2.weight",            "mlp.linear_fc2.bias",            "self_attention.core_attention.softmax_offset",
      // --post-norm (MindSpeed-LLM's TransformerLayerWithPostNorm), replicated over TP
      "post_attn_norm.weight",            "post_attn_norm.bias",            "post_mlp_layernorm.weight",
      "post_mlp_layernorm.bias"};
  if (kTop.count(name)) return true;
  int64_t i;
  std::string rest;
  // Dense GPT MTP layers (train/megatron_mtp_names.h); MoE and MLA ones are not read yet.
  if (megatron_mtp_layer_of(name, &i, &rest))
    return megatron_mtp_tensor(rest, [](const std::string& r) { return kLayer.count(r) > 0; });
  return layer_of(name, &i, &rest) &&
         (kLayer.count(rest) || megatron_moe_tensor(rest) || (mla && megatron_mla_tensor(rest)) ||
          (gdn && megatron_gdn_tensor(rest)));
}

StatusOr<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path, ": cannot read the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Tracker {
  int64_t iteration = 0;
  bool release = false;
};

StatusOr<Tracker> read_tracker(const std::string& load_dir) {
  const std::string path = load_dir + "/latest_checkpointed_iteration.txt";
  GALE_ASSIGN_OR_RETURN(std::string text, read_text(path));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text == "release") return Tracker{0, true};
  if (text.empty() || !std::all_of(text.begin(), text.end(), ::isdigit))
    return DataLoss(path, ": expected an iteration number or 'release', found '", text, "'");
  return Tracker{std::stoll(text), false};
}

std::string iteration_dir(const std::string& load_dir, const Tracker& t) {
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(t.iteration));
  return load_dir + "/" + (t.release ? std::string("release") : std::string(name));
}

CheckpointFormat format_of_dir(const std::string& dir, std::string* found) {
  bool mp_rank = false;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    names.push_back(e.path().filename().string());
    if (names.back().rfind("mp_rank_0", 0) == 0) mp_rank = true;
  }
  std::sort(names.begin(), names.end());
  for (size_t k = 0; k < names.size() && k < 6; ++k) *found += (k ? ", " : "") + names[k];
  if (names.size() > 6) *found += ", ...";
  const bool dot_metadata = fs::exists(dir + "/.metadata"), metadata_json = fs::exists(dir + "/metadata.json");
  if (metadata_json && dot_metadata) return CheckpointFormat::kMegatronTorchDist;
  if (metadata_json) {  // Gale's metadata.json, or Megatron's dist_checkpointing with another backend
    StatusOr<std::string> text = read_text(dir + "/metadata.json");
    if (text.ok() && text.value().find("sharded_backend") != std::string::npos) return CheckpointFormat::kMegatronTorchDist;
    return CheckpointFormat::kGale;
  }
  if (mp_rank) return CheckpointFormat::kMegatronTorch;
  if (dot_metadata) return CheckpointFormat::kMegatronTorchDcp;
  return CheckpointFormat::kNone;
}

// The args Namespace's scalar attributes as JSON (None and non-scalars left out), the lists or
// tuples of ints of no_rope_freq, window_size and window_attn_skip_freq, and the list forms of
// moe_router_load_balancing_type (strings) and moe_aux_loss_coeff (numbers) (moe_layer_freq's list
// is read from the Namespace itself).
nlohmann::json args_json(const PyValue* args) {
  nlohmann::json j = nlohmann::json::object();
  if (!args || args->kind != PyValue::kObject || !args->state || args->state->kind != PyValue::kDict) return j;
  for (const auto& [k, v] : args->state->entries) {
    if (k->kind != PyValue::kString) continue;
    switch (v->kind) {
      case PyValue::kBool: j[k->s] = v->b; break;
      case PyValue::kInt: j[k->s] = v->i; break;
      case PyValue::kFloat: j[k->s] = v->f; break;
      case PyValue::kString: j[k->s] = v->s; break;
      case PyValue::kList:
      case PyValue::kTuple:
        if ((k->s == "no_rope_freq" || k->s == "window_size" || k->s == "window_attn_skip_freq" ||
             k->s == "linear_attention_freq") &&
            std::all_of(v->items.begin(), v->items.end(), [](const PyRef& x) { return x->kind == PyValue::kInt; })) {
          nlohmann::json list = nlohmann::json::array();
          for (const PyRef& x : v->items) list.push_back(x->i);
          j[k->s] = std::move(list);
        }
        if (k->s == "moe_router_load_balancing_type" &&  // Megatron's list form: strings
            std::all_of(v->items.begin(), v->items.end(), [](const PyRef& x) { return x->kind == PyValue::kString; })) {
          nlohmann::json list = nlohmann::json::array();
          for (const PyRef& x : v->items) list.push_back(x->s);
          j[k->s] = std::move(list);
        }
        if (k->s == "moe_aux_loss_coeff" && std::all_of(v->items.begin(), v->items.end(), [](const PyRef& x) {
              return x->kind == PyValue::kFloat || x->kind == PyValue::kInt;
            })) {
          nlohmann::json list = nlohmann::json::array();
          for (const PyRef& x : v->items) list.push_back(x->kind == PyValue::kFloat ? x->f : static_cast<double>(x->i));
          j[k->s] = std::move(list);
        }
        break;
      default: break;
    }
  }
  return j;
}

int64_t json_int(const nlohmann::json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

// The torch format's mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt files of m.directory: their paths and
// state dicts by (tensor rank, pipeline rank), each expert-parallel rank's experts merged in under
// global expert numbers (train/megatron_moe_names.h); sets m.tensor_parallel / m.pipeline_parallel.
Status read_rank_files(MegatronCheckpoint& m, std::map<std::pair<int64_t, int64_t>, std::string>& files,
                       std::map<std::pair<int64_t, int64_t>, PyRef>& roots, MegatronExpertRankFiles* ranked_out) {
  std::map<std::vector<int64_t>, std::string> by_name;  // the numbers of mp_rank_TT[_NNN][_NNN]
  for (const auto& e : fs::directory_iterator(m.directory)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("mp_rank_", 0) != 0) continue;
    std::vector<int64_t> numbers;
    std::stringstream ss(name.substr(8));
    bool numeric = true;
    for (std::string p; std::getline(ss, p, '_');) {
      numeric = numeric && !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
      if (numeric) numbers.push_back(std::stoll(p));
    }
    if (!numeric || numbers.empty() || numbers.size() > 3)
      return DataLoss(m.directory, "/", name, ": expected mp_rank_TT, mp_rank_TT_PPP, mp_rank_TT_EEE or mp_rank_TT_PPP_EEE");
    by_name[numbers] = e.path().string() + "/model_optim_rng.pt";
  }
  std::map<std::vector<int64_t>, PyRef> by_name_roots;
  for (const auto& [numbers, path] : by_name) {  // each rank's state dict
    GALE_ASSIGN_OR_RETURN(PyRef root, read_torch_file(path));
    if (root->kind != PyValue::kDict)
      return DataLoss(path, ": expected a dict (Megatron's state_dict), found ", root->type_name());
    by_name_roots[numbers] = root;
  }
  // mp_rank_TT_NNN is a pipeline rank, or with expert parallelism and no pipeline parallelism an expert rank.
  const nlohmann::json args = by_name_roots.empty() ? nlohmann::json::object()
                                                    : args_json(by_name_roots.begin()->second->get("args"));
  const bool ep_suffix = json_int(args, "expert_model_parallel_size", 1) > 1 &&
                         json_int(args, "pipeline_model_parallel_size", 1) == 1;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> ranked;
  std::map<std::tuple<int64_t, int64_t, int64_t>, PyRef> ranked_roots;
  for (const auto& [n, path] : by_name) {
    const std::tuple<int64_t, int64_t, int64_t> rank =
        n.size() == 3 ? std::tuple{n[0], n[1], n[2]}
        : n.size() == 1 ? std::tuple{n[0], int64_t{0}, int64_t{0}}
        : ep_suffix     ? std::tuple{n[0], int64_t{0}, n[1]}
                        : std::tuple{n[0], n[1], int64_t{0}};
    ranked[rank] = path;
    ranked_roots[rank] = by_name_roots.at(n);
  }
  GALE_RETURN_IF_ERROR(merge_expert_rank_files(ranked, ranked_roots, args, &files, &roots));
  ranked_out->files = ranked;  // each expert-parallel rank's own file, for its optimizer state
  ranked_out->roots = ranked_roots;
  for (const auto& [rank, path] : files) {
    m.tensor_parallel = std::max(m.tensor_parallel, rank.first + 1);
    m.pipeline_parallel = std::max(m.pipeline_parallel, rank.second + 1);
  }
  for (int64_t p = 0; p < m.pipeline_parallel; ++p)
    for (int64_t t = 0; t < m.tensor_parallel; ++t)
      if (!files.count({t, p}))
        return NotFound(m.directory, ": the file of tensor-parallel rank ", t, ", pipeline rank ", p, " (mp_rank_",
                        t < 10 ? "0" : "", t, m.pipeline_parallel > 1 ? str_cat("_", p < 100 ? (p < 10 ? "00" : "0") : "", p) : "",
                        ") is missing for a ", m.tensor_parallel, " x ", m.pipeline_parallel, " checkpoint");
  return Status::Ok();
}

}  // namespace

const char* checkpoint_format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::kNone: return "none";
    case CheckpointFormat::kGale: return "gale";
    case CheckpointFormat::kMegatronTorch: return "torch";
    case CheckpointFormat::kMegatronTorchDist: return "torch_dist";
    case CheckpointFormat::kMegatronTorchDcp: return "torch_dcp";
  }
  return "?";
}

StatusOr<CheckpointFormat> detect_checkpoint_format(const std::string& load_dir, int64_t step) {
  Tracker t;
  if (step != kUnset) {
    t.iteration = step;
  } else {
    if (!fs::exists(load_dir + "/latest_checkpointed_iteration.txt")) return CheckpointFormat::kNone;
    GALE_ASSIGN_OR_RETURN(t, read_tracker(load_dir));
  }
  const std::string dir = iteration_dir(load_dir, t);
  if (!fs::is_directory(dir)) return CheckpointFormat::kNone;
  std::string found;
  const CheckpointFormat f = format_of_dir(dir, &found);
  if (f == CheckpointFormat::kNone)
    return FailedPrecondition(dir, ": expected a checkpoint (Gale's metadata.json, Megatron's mp_rank_* directories or "
                                   "its distributed .metadata), found ",
                              found.empty() ? std::string("an empty directory") : found);
  return f;
}

StatusOr<MegatronCheckpoint> read_megatron_checkpoint(const std::string& load_dir, int64_t step, bool with_optimizer) {
  Tracker tracker;
  if (step != kUnset) {
    tracker.iteration = step;
  } else {
    if (!fs::exists(load_dir + "/latest_checkpointed_iteration.txt"))
      return NotFound(load_dir, ": expected a Megatron checkpoint directory with latest_checkpointed_iteration.txt");
    GALE_ASSIGN_OR_RETURN(tracker, read_tracker(load_dir));
  }
  MegatronCheckpoint m;
  m.directory = iteration_dir(load_dir, tracker);
  m.release = tracker.release;
  if (!fs::is_directory(m.directory)) return NotFound(m.directory, ": the checkpoint's iteration directory does not exist");
  std::string found;
  const CheckpointFormat format = format_of_dir(m.directory, &found);
  const bool dist = format == CheckpointFormat::kMegatronTorchDist || format == CheckpointFormat::kMegatronTorchDcp;
  if (format != CheckpointFormat::kMegatronTorch && !dist)
    return FailedPrecondition(m.directory, ": expected Megatron's torch, torch_dist or torch_dcp format (mp_rank_* "
                              "directories or .metadata), found ",
                              format == CheckpointFormat::kGale ? std::string("a Gale checkpoint (metadata.json)") : found);
  m.format = format;
  // mp_rank_TT or mp_rank_TT_PPP directories; torch_dist / torch_dcp: one global state dict.
  std::map<std::pair<int64_t, int64_t>, std::string> files;
  std::map<std::pair<int64_t, int64_t>, PyRef> roots;
  std::optional<MegatronOptimizerState> optimizer;
  MegatronExpertRankFiles expert_ranks;  // the torch format's files by (tensor, pipeline, expert) rank
  if (dist) {
    // A Gated DeltaNet model: its optimizer state refused before it is read (below), its sharded in_proj /
    // conv1d sections joined (train/megatron_gdn_dist.h).
    std::string args_file;
    GALE_ASSIGN_OR_RETURN(PyRef dist_args, read_megatron_dist_args(m.directory, format, &args_file));
    GALE_ASSIGN_OR_RETURN(const std::optional<MegatronGdnSizes> dist_gdn,
                          megatron_gdn_sizes(args_json(dist_args.get()), args_file + " (args)"));
    GALE_ASSIGN_OR_RETURN(MegatronDistState state,
                          read_megatron_dist_state(m.directory, format, with_optimizer && !dist_gdn));
    GALE_RETURN_IF_ERROR(globalize_dist_experts(state, m.directory));
    if (dist_gdn)
      for (auto& [k, v] : state.root->entries)
        if (k->kind == PyValue::kString && k->s == "model" && v->kind == PyValue::kDict)
          GALE_RETURN_IF_ERROR(join_megatron_gdn_dist_sections(*dist_gdn, *v, m.directory));
    files[{0, 0}] = m.directory;  // named in messages
    roots[{0, 0}] = state.root;
    optimizer = std::move(state.optimizer);
  } else {
    GALE_RETURN_IF_ERROR(read_rank_files(m, files, roots, &expert_ranks));
  }
  const PyValue& first = *roots.at({0, 0});
  const std::string first_path = files.at({0, 0});
  if (first.get("model") == nullptr && first.get("model0") == nullptr)
    return DataLoss(first_path, ": expected Megatron's 'model' (or 'model0', ...) state dict, found none");
  m.virtual_chunks = 0;
  if (first.get("model")) {
    m.virtual_chunks = 1;
  } else {
    while (first.get(str_cat("model", m.virtual_chunks))) ++m.virtual_chunks;
  }
  if (const PyValue* v = first.get("checkpoint_version"))
    m.checkpoint_version = v->kind == PyValue::kFloat ? v->f : v->kind == PyValue::kInt ? static_cast<double>(v->i) : 0;
  if (m.checkpoint_version < 3.0)
    return Unimplemented(first_path, ": checkpoint_version ", m.checkpoint_version,
                         ": expected 3.0 (Megatron-Core's layouts; older query/key/value orderings are not supported)");
  if (const PyValue* it = first.get("iteration"); it && it->kind == PyValue::kInt) m.iteration = it->i;
  else if (const PyValue* total = first.get("total_iters"); total && total->kind == PyValue::kInt) m.iteration = total->i;
  if (m.release) m.iteration = 0;
  m.args = megatron_moe_args_json(args_json(first.get("args")), first.get("args"));
  if (m.args.empty())
    return DataLoss(first_path, ": expected Megatron's 'args' (an argparse.Namespace), found ",
                    first.get("args") ? first.get("args")->type_name() : std::string("none"));
  m.consumed_train_samples = json_int(m.args, "consumed_train_samples", 0);
  m.consumed_valid_samples = json_int(m.args, "consumed_valid_samples", 0);
  m.skipped_train_samples = json_int(m.args, "skipped_train_samples", 0);
  if (const PyValue* f = first.get("num_floating_point_operations_so_far"))
    m.floating_point_operations_so_far = f->kind == PyValue::kFloat ? f->f : f->kind == PyValue::kInt ? f->i : 0.0;
  // A gated fc1 ([gate; linear half] per TP rank): --swiglu, --quick-geglu or MindSpeed-LLM's --geglu / --gelu-tanh.
  const bool swiglu = m.args.value("swiglu", false) || m.args.value("quick_geglu", false) ||
                      m.args.value("geglu", false) || m.args.value("gelu_tanh", false),
             mla = m.args.value("multi_latent_attention", false);
  // A Gated DeltaNet model: its mixers' sizes (their in_proj / conv1d sections split over TP).
  GALE_ASSIGN_OR_RETURN(const std::optional<MegatronGdnSizes> gdn, megatron_gdn_sizes(m.args, first_path + " (args)"));
  if (gdn && with_optimizer)
    return Unimplemented(first_path, ": Megatron's optimizer state of a Gated DeltaNet model in the ",
                         checkpoint_format_name(format), " format: not supported yet; pass --no-load-optim (or "
                         "--finetune) to load the model weights and iteration only");
  // Global layer numbers: chunk-major, then stage, each numbering its layers from 0.
  int64_t offset = 0;
  for (int64_t v = 0; v < m.virtual_chunks; ++v) {
    const std::string key = m.virtual_chunks == 1 && first.get("model") ? "model" : str_cat("model", v);
    for (int64_t p = 0; p < m.pipeline_parallel; ++p) {
      std::vector<const PyValue*> dicts;
      for (int64_t t = 0; t < m.tensor_parallel; ++t) {
        const PyValue* d = roots.at({t, p})->get(key);
        if (d == nullptr || d->kind != PyValue::kDict)
          return DataLoss(files.at({t, p}), ": expected the state dict '", key, "', found ",
                          d ? d->type_name() : std::string("none"));
        dicts.push_back(d);
      }
      int64_t layers = 0;
      for (const auto& [k, val] : dicts[0]->entries) {
        int64_t i;
        std::string rest;
        if (k->kind == PyValue::kString && layer_of(k->s, &i, &rest)) layers = std::max(layers, i + 1);
      }
      for (const auto& [k, val] : dicts[0]->entries) {
        const std::string where = files.at({0, p});
        if (k->kind != PyValue::kString) return DataLoss(where, ": a state-dict key that is not a string");
        std::string name = k->s;
        if (ends_with(name, "_extra_state")) continue;
        if (val->kind != PyValue::kTensor)
          return DataLoss(where, ": '", name, "' in '", key, "': expected a tensor, found ", val->type_name());
        name = gale_name_te(name, offset, gdn.has_value());
        if (!known_tensor(name, mla, gdn.has_value()))
          return Unimplemented(where, ": tensor '", k->s, "' in '", key, "' has no place in Gale's GPT model "
                               "(other Megatron layers in this format: not supported yet)");
        std::vector<Tensor> parts;
        for (int64_t t = 0; t < m.tensor_parallel; ++t) {
          const PyValue* x = dicts[t]->get(k->s);
          if (x == nullptr || x->kind != PyValue::kTensor)
            return DataLoss(files.at({t, p}), ": expected tensor '", k->s, "' (as tensor-parallel rank 0 has), found ",
                            x ? x->type_name() : std::string("none"));
          parts.push_back(x->data);
        }
        int64_t layer;
        std::string rest;
        const bool gdn_mixer = gdn && layer_of(name, &layer, &rest) && megatron_gdn_mixer_tensor(rest);
        GALE_ASSIGN_OR_RETURN(Tensor whole, gdn_mixer ? megatron_gdn_merge_tp(rest, parts, *gdn, where)
                                                      : megatron_merge_tp(parts, megatron_split_of(name, swiglu), k->s, where));
        if (!m.tensors.count(name)) m.tensors.emplace(name, std::move(whole));  // tied copies: the first
      }
      offset += layers;
    }
  }
  if (mla) {  // Megatron's MLA names -> Gale's (the model's and the optimizer state's)
    GALE_RETURN_IF_ERROR(megatron_mla_to_gale(m.args, dist ? 1 : m.tensor_parallel, first_path, m.tensors));
    if (optimizer)
      for (auto& [state, by_name] : optimizer->tensors)
        GALE_RETURN_IF_ERROR(megatron_mla_to_gale(m.args, 1, first_path, by_name));
  }
  if (dist) {  // global tensors; the layout that saved them, for the record
    m.tensor_parallel = json_int(m.args, "tensor_model_parallel_size", 1);
    m.pipeline_parallel = json_int(m.args, "pipeline_model_parallel_size", 1);
  }
  // The model flags; Megatron records None for unset ones.
  nlohmann::json a = m.args;
  const std::string where = first_path + " (args)";
  if (!a.contains("num_query_groups")) a["num_query_groups"] = 1;
  if (!a.contains("kv_channels") && a.contains("hidden_size") && a.contains("num_attention_heads"))
    a["kv_channels"] = a["hidden_size"].get<int64_t>() / std::max<int64_t>(a["num_attention_heads"].get<int64_t>(), 1);
  if (!a.contains("seq_length") && a.contains("max_position_embeddings")) a["seq_length"] = a["max_position_embeddings"];
  if (!a.contains("max_position_embeddings") && a.contains("seq_length")) a["max_position_embeddings"] = a["seq_length"];
  if (!a.contains("norm_epsilon")) a["norm_epsilon"] = 1e-5;
  auto emb = m.tensors.find("embedding.word_embeddings.weight");
  if (emb == m.tensors.end())
    return DataLoss(m.directory, ": no embedding.word_embeddings.weight in any pipeline stage's state dict");
  a["padded_vocab_size"] = emb->second.shape()[0];
  if (!a.contains("make_vocab_size_divisible_by")) a["make_vocab_size_divisible_by"] = 128;
  if (!m.args.value("untie_embeddings_and_output_weights", false)) m.tensors.erase("output_layer.weight");
  // Each rank file's optimizer (and distrib_optim.pt), merged; torch_dcp's plain state dict as one rank file's.
  if (with_optimizer && format != CheckpointFormat::kMegatronTorchDist) {
    GALE_ASSIGN_OR_RETURN(optimizer, read_megatron_torch_optimizer(files, roots, gale_name_of, swiglu, expert_ranks));
    if (mla)  // Megatron's MLA names -> Gale's, as the weights' (the TP pieces merged as theirs)
      for (auto& [state, by_name] : optimizer->tensors)
        GALE_RETURN_IF_ERROR(megatron_mla_to_gale(m.args, dist ? 1 : m.tensor_parallel, first_path, by_name));
  }
  if (optimizer) GALE_RETURN_IF_ERROR(take_optimizer_state(std::move(*optimizer), m));
  GALE_ASSIGN_OR_RETURN(m.model, model_args_from_json(a, where));
  GALE_RETURN_IF_ERROR(refuse_megatron_variant(m.model, where));
  GALE_ASSIGN_OR_RETURN(m.moe, megatron_moe_args(a, where, m.model.num_layers));
  GALE_RETURN_IF_ERROR(check_megatron_experts(m.tensors, m.moe, m.model.num_layers, m.directory));
  m.model.padded_vocab_size = emb->second.shape()[0];
  if (m.model.kv_channels == kUnset) m.model.kv_channels = m.model.hidden_size / m.model.num_attention_heads;
  m.model.num_kv_heads = m.model.group_query_attention ? m.model.num_query_groups : m.model.num_attention_heads;
  m.vocab_size = json_int(m.args, "vocab_size", m.model.padded_vocab_size);
  if (m.model.num_layers != offset)
    return DataLoss(m.directory, ": args say num_layers = ", m.model.num_layers, ", the state dicts hold ", offset, " layers");
  return m;
}

StatusOr<nlohmann::json> read_megatron_args(const std::string& load_dir, int64_t step, std::string* where) {
  Tracker tracker;
  if (step != kUnset) {
    tracker.iteration = step;
  } else {
    GALE_ASSIGN_OR_RETURN(tracker, read_tracker(load_dir));
  }
  const std::string dir = iteration_dir(load_dir, tracker);
  std::string found;
  const CheckpointFormat format = format_of_dir(dir, &found);
  if (format == CheckpointFormat::kMegatronTorchDist || format == CheckpointFormat::kMegatronTorchDcp) {
    GALE_ASSIGN_OR_RETURN(PyRef ns, read_megatron_dist_args(dir, format, where));
    const std::string file = *where;
    *where += " (args)";
    nlohmann::json args = args_json(ns.get());
    if (args.empty()) return DataLoss(file, ": expected Megatron's 'args' (an argparse.Namespace), found ", ns->type_name());
    return megatron_moe_args_json(std::move(args), ns.get());
  }
  std::string path = dir + "/mp_rank_00/model_optim_rng.pt";
  if (!fs::exists(path)) path = dir + "/mp_rank_00_000/model_optim_rng.pt";
  GALE_ASSIGN_OR_RETURN(PyRef root, read_torch_file(path));
  *where = path + " (args)";
  nlohmann::json args = root->kind == PyValue::kDict ? args_json(root->get("args")) : nlohmann::json::object();
  if (args.empty()) return DataLoss(path, ": expected Megatron's 'args' (an argparse.Namespace), found none");
  return megatron_moe_args_json(std::move(args), root->get("args"));
}

StatusOr<TemporaryGaleCheckpoint> TemporaryGaleCheckpoint::write(const MegatronCheckpoint& m,
                                                                 const std::string& source_dir) {
  static std::atomic<int> counter{0};
  TemporaryGaleCheckpoint t;
  t.dir_ = (fs::temp_directory_path() / str_cat("gale_megatron_", ::getpid(), "_", counter++)).string();
  std::error_code ec;
  fs::remove_all(t.dir_, ec);
  GALE_RETURN_IF_ERROR(save_megatron_as_gale(m, t.dir_, source_dir));
  return t;
}

TemporaryGaleCheckpoint::~TemporaryGaleCheckpoint() {
  if (dir_.empty()) return;
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

TensorSource megatron_tensor_source(const MegatronCheckpoint& m) {
  return [&m](const std::string& name, const Shape& shape) -> StatusOr<Tensor> {
    auto it = m.tensors.find(name);
    if (it == m.tensors.end()) return NotFound(m.directory, ": no tensor '", name, "' in the Megatron checkpoint");
    const Tensor& t = it->second;
    if (t.shape() != shape)
      return FailedPrecondition(m.directory, ": tensor '", name, "' has shape ", t.shape_string(), ", expected ",
                                shape_string(shape));
    if (t.dtype() == DType::kF32) return t.clone();
    Tensor out = Tensor::empty(shape, DType::kF32);
    GALE_RETURN_IF_ERROR(convert_elements(st_dtype_of(t.dtype()), t.raw(), DType::kF32, out.raw(), t.numel(), name));
    return out;
  };
}

Status save_megatron_as_gale(const MegatronCheckpoint& m, const std::string& save_dir, const std::string& source_dir) {
  Arguments args;
  args.model = m.model;
  args.moe = m.moe;
  const ModelConfig config = model_config_from_args(args);
  Comm self = make_self_communicator("world");
  CheckpointWriter w(save_dir, m.iteration, *self);
  for (const auto& [name, t] : m.tensors) {
    if (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) {
      GALE_RETURN_IF_ERROR(w.add(name, t));
    } else {
      GALE_ASSIGN_OR_RETURN(Tensor f, megatron_tensor_source(m)(name, t.shape()));
      GALE_RETURN_IF_ERROR(w.add(name, f));
    }
  }
  if (m.optimizer)  // Gale's names for optimizer state (docs/formats/checkpoint.md): optimizer.<state>.<param>
    for (const auto& [state, by_name] : m.optimizer->tensors)
      for (const auto& [name, t] : by_name) GALE_RETURN_IF_ERROR(w.add(str_cat("optimizer.", state, ".", name), t));
  nlohmann::json sections;
  sections["gale_trainer_state_version"] = 1;
  sections["model"] = checkpoint_model_section(config);
  sections["args"] = model_flags_json(m.model);
  add_moe_flags_json(m.moe, &sections["args"]);
  sections["args"]["vocab_size"] = m.vocab_size;
  sections["args"]["tensor_model_parallel_size"] = m.tensor_parallel;
  sections["trainer"] = {{"iteration", m.iteration},
                         {"consumed_train_samples", m.consumed_train_samples},
                         {"skipped_train_samples", m.skipped_train_samples},
                         {"consumed_valid_samples", m.consumed_valid_samples},
                         {"num_floating_point_operations_so_far", m.floating_point_operations_so_far}};
  if (m.optimizer) {
    const MegatronOptimizerState& o = *m.optimizer;
    sections["optimizer"] = {{"type", o.type},
                             {"steps_taken", o.step},
                             {"use_distributed_optimizer", o.layout != "non-distributed"},
                             {"megatron_layout", o.layout}};
    if (!o.grad_scaler.is_null()) sections["optimizer"]["grad_scaler"] = o.grad_scaler;
    sections["opt_param_scheduler"] = o.scheduler;  // Megatron's state dict: Gale's section has its keys
  }
  sections["megatron_source"] = {{"directory", source_dir},
                                 {"format", checkpoint_format_name(m.format)},
                                 {"checkpoint_version", m.checkpoint_version},
                                 {"tensor_model_parallel_size", m.tensor_parallel},
                                 {"pipeline_model_parallel_size", m.pipeline_parallel}};
  return w.commit(sections);
}

Status write_megatron_checkpoint(const MegatronSaveOptions& o, const ModelArgs& model,
                                 const std::vector<NamedTensor>& tensors) {
  const int64_t tp = o.tensor_parallel, pp = o.pipeline_parallel;
  if (tp <= 0 || pp <= 0)
    return InvalidArgument("--target-tensor-parallel-size / --target-pipeline-parallel-size: expected positive sizes, "
                           "found ", tp, " and ", pp);
  if (model.num_layers % pp)
    return InvalidArgument("--target-pipeline-parallel-size ", pp, ": the ", model.num_layers,
                           " layers do not split evenly (Megatron's default split is needed)");
  const int64_t heads = model.num_attention_heads,
                groups = model.group_query_attention ? model.num_query_groups : model.num_attention_heads;
  if (heads % tp || groups % tp || model.ffn_hidden_size % tp)
    return InvalidArgument("--target-tensor-parallel-size ", tp, ": expected it to divide the attention heads (", heads,
                           "), query groups (", groups, ") and ffn_hidden_size (", model.ffn_hidden_size, ")");
  GALE_RETURN_IF_ERROR(check_megatron_mtp_target(model, o.moe));
  const int64_t mtp_layers = model.mtp_num_layers == kUnset ? 0 : model.mtp_num_layers;
  const int64_t ep = o.expert_parallel;
  GALE_RETURN_IF_ERROR(check_megatron_moe_target(o.moe, tp, ep));
  const int64_t local_experts = o.moe.enabled() ? o.moe.num_experts / ep : 0;
  if (model.multi_latent_attention) GALE_RETURN_IF_ERROR(check_megatron_mla_tp(model, tp));
  GALE_RETURN_IF_ERROR(refuse_megatron_variant(model, o.save_dir));
  const std::optional<MegatronGdnSizes> gdn = megatron_gdn_sizes_of(model);
  if (gdn && (gdn->NK % tp || gdn->NV % tp))
    return InvalidArgument("--target-tensor-parallel-size ", tp, ": expected it to divide the Gated DeltaNet key heads (",
                           gdn->NK, ") and value heads (", gdn->NV, ")");
  const int64_t vocab = o.vocab_size > 0 ? o.vocab_size : model.padded_vocab_size;
  const int64_t padded = pad_vocab_size(vocab, model.make_vocab_size_divisible_by, tp);
  const int64_t per_stage = model.num_layers / pp;
  // The args Namespace: the flags Megatron's check_checkpoint_args and load_args_from_checkpoint read.
  PyRef ns = PyValue::dict();
  auto set_int = [&](const char* k, int64_t v) { ns->set(k, PyValue::integer(v)); };
  auto set_bool = [&](const char* k, bool v) { ns->set(k, PyValue::boolean(v)); };
  set_int("num_layers", model.num_layers);
  set_int("hidden_size", model.hidden_size);
  set_int("ffn_hidden_size", model.ffn_hidden_size);
  set_int("num_attention_heads", heads);
  set_int("kv_channels", model.kv_channels != kUnset ? model.kv_channels : model.hidden_size / heads);
  set_bool("group_query_attention", model.group_query_attention);
  set_int("num_query_groups", groups);
  set_int("seq_length", model.seq_length);
  set_int("max_position_embeddings", model.max_position_embeddings);
  ns->set("position_embedding_type", PyValue::str(model.position_embedding_type));
  set_bool("add_position_embedding", model.position_embedding_type == "learned_absolute");
  set_int("rotary_base", model.rotary_base);
  ns->set("rotary_percent", PyValue::real(model.rotary_percent));
  if (!unset(model.rotary_seq_len_interpolation_factor)) {  // Megatron's --rotary-seq-len-interpolation-factor is an int
    const double f = model.rotary_seq_len_interpolation_factor;
    if (f != std::floor(f) || f < 1.0)
      return Unimplemented("--rotary-seq-len-interpolation-factor ", f, ": Megatron's flag is an integer (type=int), "
                           "so its checkpoint args cannot hold this factor");
    set_int("rotary_seq_len_interpolation_factor", static_cast<int64_t>(f));
  }
  if (model.rope_scaling_type == "longrope")  // MindSpeed-LLM's LongRoPE: no place in Megatron-LM's args
    return Unimplemented("--rope-scaling-type longrope: Megatron-LM's checkpoint args have no LongRoPE (MindSpeed-LLM's "
                         "flags), so a Megatron-format checkpoint would lose it; save a Gale or Hugging Face checkpoint");
  set_bool("rotary_interleaved", model.rotary_interleaved);
  ns->set("normalization", PyValue::str(model.normalization));
  ns->set("norm_epsilon", PyValue::real(model.norm_epsilon));
  set_bool("apply_layernorm_1p", model.apply_layernorm_1p);
  set_bool("swiglu", model.swiglu);
  set_bool("squared_relu", model.squared_relu);
  set_bool("openai_gelu", model.openai_gelu);
  set_bool("quick_geglu", model.quick_geglu);  // Megatron main's gpt-oss activation options
  set_bool("geglu", model.geglu);  // MindSpeed-LLM's Gemma flags
  set_bool("gelu_tanh", model.gelu_tanh);
  set_bool("add_rmsnorm_offset", model.add_rmsnorm_offset);
  set_bool("input_embeds_norm", model.input_embeds_norm);
  // MindSpeed-LLM's Gemma-2 args (None / False when off; the window is window_size below)
  set_bool("post_norm", model.post_norm);
  ns->set("query_pre_attn_scalar",
          model.query_pre_attn_scalar == kUnset ? PyValue::none() : PyValue::integer(model.query_pre_attn_scalar));
  ns->set("attn_logit_softcapping",
          unset(model.attn_logit_softcapping) ? PyValue::none() : PyValue::real(model.attn_logit_softcapping));
  ns->set("output_logit_softcapping",
          unset(model.output_logit_softcapping) ? PyValue::none() : PyValue::real(model.output_logit_softcapping));
  ns->set("glu_linear_offset", PyValue::real(model.glu_linear_offset));
  ns->set("activation_func_clamp_value", unset(model.activation_func_clamp_value)
                                             ? PyValue::none()
                                             : PyValue::real(model.activation_func_clamp_value));
  set_bool("untie_embeddings_and_output_weights", model.untie_embeddings_and_output_weights);
  set_bool("add_bias_linear", model.add_bias_linear);
  set_bool("add_qkv_bias", model.add_qkv_bias);
  if (model.multi_latent_attention) megatron_mla_args(model, *ns);
  else set_bool("qk_layernorm", model.qk_layernorm);  // Megatron's --qk-layernorm: Qwen3's and Gemma-3's q/k norms
  set_bool("attention_output_gate", model.attention_output_gate);  // linear_qkv holds the gate rows too
  set_bool("qk_l2_norm", model.qk_l2_norm);  // Megatron main's TransformerConfig field (False before it)
  set_bool("qk_clip", model.qk_clip);  // MuonClip (model/qk_clip.h): Megatron's args always hold the four
  ns->set("qk_clip_alpha", PyValue::real(model.qk_clip_alpha));
  ns->set("qk_clip_threshold", PyValue::real(model.qk_clip_threshold));
  set_bool("log_max_attention_logit", model.log_max_attention_logit);
  ns->set("softmax_type", PyValue::str(model.softmax_type));  // learnable: core_attention.softmax_offset
  if (!model.no_rope_pattern.empty()) {  // --no-rope-freq as the per-layer list Megatron's config holds
    PyRef list = PyValue::list();
    for (int v : model.no_rope_pattern) list->items.push_back(PyValue::integer(v));
    ns->set("no_rope_freq", list);
  }
  if (model.sliding_window != kUnset) {  // --window-size (left, right) = (W − 1, 0), as Megatron's config holds it
    ns->set("window_size", PyValue::tuple({PyValue::integer(model.sliding_window - 1), PyValue::integer(0)}));
    if (!model.window_attn_pattern.empty()) {  // --window-attn-skip-freq as the per-layer list
      PyRef list = PyValue::list();
      for (int v : model.window_attn_pattern) list->items.push_back(PyValue::integer(v));
      ns->set("window_attn_skip_freq", list);
    }
  }
  if (model.position_embedding_type == "yarn") {  // Megatron's YaRN args (the yarn_* ones None when unset)
    ns->set("rotary_scaling_factor", PyValue::real(model.rotary_scaling_factor));
    ns->set("mscale", PyValue::real(model.mscale));
    ns->set("mscale_all_dim", PyValue::real(model.mscale_all_dim));
    ns->set("yarn_original_max_position_embeddings", model.yarn_original_max_position_embeddings == kUnset
                                                         ? PyValue::none()
                                                         : PyValue::integer(model.yarn_original_max_position_embeddings));
    ns->set("yarn_beta_fast", unset(model.yarn_beta_fast) ? PyValue::none() : PyValue::real(model.yarn_beta_fast));
    ns->set("yarn_beta_slow", unset(model.yarn_beta_slow) ? PyValue::none() : PyValue::real(model.yarn_beta_slow));
    set_bool("yarn_correction_range_round_to_int", model.yarn_correction_range_round_to_int);
  }
  set_int("make_vocab_size_divisible_by", model.make_vocab_size_divisible_by);
  set_int("padded_vocab_size", padded);
  set_int("vocab_size", vocab);
  ns->set("tokenizer_type", o.tokenizer_type.empty() ? PyValue::none() : PyValue::str(o.tokenizer_type));
  set_int("tensor_model_parallel_size", tp);
  set_int("pipeline_model_parallel_size", pp);
  ns->set("virtual_pipeline_model_parallel_size", PyValue::none());
  ns->set("transformer_impl", PyValue::str("local"));
  ns->set("ckpt_format", PyValue::str("torch"));
  set_int("iteration", o.iteration);
  set_int("consumed_train_samples", o.consumed_train_samples);
  set_int("skipped_train_samples", 0);
  set_int("consumed_valid_samples", 0);
  set_bool("no_save_optim", true);
  set_bool("no_save_rng", true);
  set_bool("data_parallel_random_init", false);
  set_bool("fp16", false);
  set_bool("bf16", false);
  ns->set("params_dtype", PyValue::global("torch.float32"));
  add_megatron_moe_args(o.moe, tp, ep, *ns);
  if (gdn) megatron_gdn_args(model, *ns);  // and transformer_impl "transformer_engine"
  // Megatron's MTP args (None without: it builds no MTP block); the layers are on the last stage.
  ns->set("mtp_num_layers", mtp_layers > 0 ? PyValue::integer(mtp_layers) : PyValue::none());
  ns->set("mtp_loss_scaling_factor", PyValue::real(model.mtp_loss_scaling_factor));
  PyRef args = PyValue::object("argparse.Namespace", ns);

  // Whole tensors by stage; the vocabulary re-padded for tp.
  std::map<std::string, Tensor> whole;
  for (const NamedTensor& nt : tensors) {
    Tensor t = nt.tensor;
    if (nt.name == "embedding.word_embeddings.weight" || nt.name == "output_layer.weight") {
      Tensor padded_t = Tensor::zeros({padded, t.shape()[1]}, t.dtype());
      megatron_copy_rows(t, 0, std::min(padded, t.shape()[0]), padded_t, 0);
      t = padded_t;
    }
    whole[nt.name] = t;
  }
  char iter_name[32];
  std::snprintf(iter_name, sizeof(iter_name), "iter_%07lld", static_cast<long long>(o.iteration));
  const std::string iter_dir = o.save_dir + "/" + (o.release ? std::string("release") : std::string(iter_name));
  const bool swiglu = model.gated_mlp();  // fc1 split as [gate; linear half] per rank
  for (int64_t p = 0; p < pp; ++p)
    for (int64_t t = 0; t < tp; ++t)
    for (int64_t e = 0; e < ep; ++e) {
      PyRef sd = PyValue::dict();
      for (const auto& [name, w] : whole) {
        int64_t i, expert_rank;
        std::string rest, local = name, expert_local;
        // An expert goes to its expert-parallel rank's files only, numbered from 0 there.
        if (megatron_local_expert(name, local_experts, &expert_rank, &expert_local) && expert_rank != e) continue;
        if (layer_of(expert_local.empty() ? name : expert_local, &i, &rest)) {
          if (i / per_stage != p) continue;
          if (model.multi_latent_attention) {
            GALE_ASSIGN_OR_RETURN(rest, megatron_mla_local_name(rest));
          }
          local = str_cat("decoder.layers.", i - p * per_stage, ".", rest);
        } else if (name.rfind("embedding.", 0) == 0) {
          // The MTP layers embed the rolled ids: Megatron's last (mtp_process) stage holds its own copy.
          if (p != 0 && !(mtp_layers > 0 && p == pp - 1)) continue;
        } else if (name.rfind("output_layer.", 0) == 0 || name.rfind("decoder.final_layernorm.", 0) == 0 ||
                   (mtp_layers > 0 && megatron_mtp_layer_of(name, &i, &rest))) {
          if (p != pp - 1) continue;  // MTP layers: all on the last stage, numbered from 0 as in the model
          if (i >= mtp_layers && name.rfind("mtp.", 0) == 0)
            return InvalidArgument("tensor '", name, "': expected MTP layers 0 .. ", mtp_layers - 1,
                                   " (--mtp-num-layers ", mtp_layers, ")");
        } else {
          return Unimplemented("tensor '", name, "' has no place in Megatron-Core's GPT model (not supported yet)");
        }
        Tensor piece;
        if (gdn && megatron_gdn_mixer_tensor(rest)) {  // rest: the layer's (a layer tensor; else not a mixer name)
          GALE_ASSIGN_OR_RETURN(piece, megatron_gdn_cut_tp(rest, w, *gdn, tp, t));
        } else {
          const MegatronSplit split =
              megatron_mla_duplicated(model, name) ? MegatronSplit::kReplicated : megatron_split_of(name, swiglu);
          GALE_ASSIGN_OR_RETURN(piece, megatron_cut_tp(w, split, tp, t, name));
        }
        sd->set(local, PyValue::tensor(piece.sole_owner() ? piece : piece.clone()));
      }
      // Megatron's parallel linear layers save an `_extra_state` of None (kept for Transformer
      // Engine's FP8 metadata): written as Megatron writes them.
      for (int64_t i = 0; i < per_stage; ++i) {
        const int64_t global = p * per_stage + i;
        const bool moe_layer = o.moe.enabled() && o.moe.layer_pattern.at(static_cast<size_t>(global)) != 0;
        std::vector<std::string> linears = megatron_extra_state_linears(o.moe, moe_layer, local_experts);
        if (model.multi_latent_attention) {  // its attention linears instead of linear_qkv and linear_proj
          const std::vector<std::string> mla_linears = megatron_mla_linears(model);
          linears.erase(linears.begin(), linears.begin() + 2);
          linears.insert(linears.begin(), mla_linears.begin(), mla_linears.end());
        }
        if (gdn && model.linear_attention_pattern.at(static_cast<size_t>(global)) != 0) {  // GDN: in_proj, out_proj
          const std::vector<std::string> gdn_linears = megatron_gdn_linears();
          linears.erase(linears.begin(), linears.begin() + 2);
          linears.insert(linears.begin(), gdn_linears.begin(), gdn_linears.end());
        }
        for (const std::string& linear : linears)
          sd->set(str_cat("decoder.layers.", i, ".", linear, "._extra_state"), PyValue::none());
      }
      if (p == pp - 1) {
        for (int64_t k = 0; k < mtp_layers; ++k)  // eh_proj and the inner layer's linears (a dense layer's)
          for (const std::string& key : megatron_mtp_extra_state_keys(k, megatron_extra_state_linears(o.moe, false, 0)))
            sd->set(key, PyValue::none());
        sd->set("output_layer._extra_state", PyValue::none());
      }
      // Tied embeddings under pipeline parallelism: the last stage holds its own copy (output_layer.weight).
      if (pp > 1 && p == pp - 1 && !model.untie_embeddings_and_output_weights) {
        GALE_ASSIGN_OR_RETURN(Tensor piece, megatron_cut_tp(whole.at("embedding.word_embeddings.weight"),
                                                            MegatronSplit::kRows, tp, t,
                                                            "embedding.word_embeddings.weight"));
        sd->set("output_layer.weight", PyValue::tensor(piece.clone()));
      }
      PyRef root = PyValue::dict();
      root->set("args", args);
      root->set("checkpoint_version", PyValue::real(3.0));
      root->set("iteration", PyValue::integer(o.iteration));
      root->set("model", sd);
      char rank_name[48];
      if (pp == 1)
        std::snprintf(rank_name, sizeof(rank_name), "mp_rank_%02lld", static_cast<long long>(t));
      else
        std::snprintf(rank_name, sizeof(rank_name), "mp_rank_%02lld_%03lld", static_cast<long long>(t),
                      static_cast<long long>(p));
      char expert_suffix[16] = "";  // Megatron's _EEE with expert parallelism
      if (ep > 1) std::snprintf(expert_suffix, sizeof(expert_suffix), "_%03lld", static_cast<long long>(e));
      const std::string dir = iter_dir + "/" + rank_name + expert_suffix;
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) return FailedPrecondition(dir, ": cannot create the directory (", ec.message(), ")");
      GALE_RETURN_IF_ERROR(write_torch_file(dir + "/model_optim_rng.pt", *root));
    }
  return write_file_atomically(o.save_dir + "/latest_checkpointed_iteration.txt",
                               o.release ? std::string("release") : std::to_string(o.iteration));
}

}  // namespace gale
