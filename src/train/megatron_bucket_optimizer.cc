// Megatron's bucket-space optimizer state (dp_reshardable, dp_zero_gather_scatter): each model-parallel rank's buffer
// layout rebuilt, its buckets cut into parameters, the TP pieces merged.
#include "train/megatron_bucket_optimizer.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>

#include "ckpt/safetensors_dtype.h"
#include "optim/grad_buckets.h"
#include "train/megatron_tp_split.h"

namespace gale {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

const char kOutWay[] = "pass --no-load-optim (or --finetune) to load the model weights and iteration only";
const char kBuckets[] = "optimizer.distributed.";

int64_t int_attr(const PyValue* args, const char* name, int64_t fallback) {
  const PyValue* v = args ? args->attr(name) : nullptr;
  return v && v->kind == PyValue::kInt ? v->i : fallback;
}

bool model_key(const std::string& key) {
  for (const char* p : {"optimizer", "rng_state", "rerun_state_machine", "opt_param_scheduler", "chained_"})
    if (starts_with(key, p)) return false;
  // The router's expert_bias is a buffer, not a parameter: no gradient buffer holds it.
  if (key.size() > 19 && key.compare(key.size() - 19, 19, ".router.expert_bias") == 0) return false;
  return key.find("_extra_state") == std::string::npos;
}

// MoE: the stacked experts of SequentialMLP / TEGroupedMLP in torch_dist, "mlp.experts.experts.<linear>.<param>".
bool expert_sub(const std::string& sub) { return starts_with(sub, "mlp.experts."); }

// Where a layer's parameter sits in Megatron's TransformerLayer registration order. The local spec registers
// input_layernorm, self_attention (linear_proj, linear_qkv, q/k_layernorm), pre_mlp_layernorm, mlp (linear_fc1,
// linear_fc2); its sharded state dict names the norms as Transformer Engine's fused ones
// (self_attention.linear_qkv.layer_norm_*, mlp.linear_fc1.layer_norm_*). Transformer Engine's spec fuses the
// norms into LayerNormLinear modules, which register the norm's parameters before the linear's.
int layer_rank(const std::string& sub, bool te) {
  static const std::map<std::string, int> kLocal = {
      {"input_layernorm.weight", 0}, {"self_attention.linear_qkv.layer_norm_weight", 0},
      {"input_layernorm.bias", 1}, {"self_attention.linear_qkv.layer_norm_bias", 1},
      {"self_attention.linear_proj.weight", 2}, {"self_attention.linear_proj.bias", 3},
      {"self_attention.linear_qkv.weight", 4}, {"self_attention.linear_qkv.bias", 5},
      {"self_attention.q_layernorm.weight", 6}, {"self_attention.q_layernorm.bias", 7},
      {"self_attention.k_layernorm.weight", 8}, {"self_attention.k_layernorm.bias", 9},
      {"pre_mlp_layernorm.weight", 10}, {"mlp.linear_fc1.layer_norm_weight", 10},
      {"pre_mlp_layernorm.bias", 11}, {"mlp.linear_fc1.layer_norm_bias", 11},
      {"mlp.linear_fc1.weight", 12}, {"mlp.linear_fc1.bias", 13},
      {"mlp.linear_fc2.weight", 14}, {"mlp.linear_fc2.bias", 15},
      // MoELayer registers its router, its experts (in a buffer of their own) and then its shared experts.
      {"mlp.router.weight", 12}, {"mlp.router.bias", 13},
      {"mlp.shared_experts.linear_fc1.weight", 16}, {"mlp.shared_experts.linear_fc1.bias", 17},
      {"mlp.shared_experts.linear_fc2.weight", 18}, {"mlp.shared_experts.linear_fc2.bias", 19},
      // --post-norm: MindSpeed-LLM's TransformerLayerWithPostNorm registers its two norms after the base layer's modules.
      {"post_attn_norm.weight", 20}, {"post_attn_norm.bias", 21},
      {"post_mlp_layernorm.weight", 22}, {"post_mlp_layernorm.bias", 23}};
  static const std::map<std::string, int> kTe = {
      {"input_layernorm.weight", 0}, {"input_layernorm.bias", 1},
      {"self_attention.linear_proj.weight", 2}, {"self_attention.linear_proj.bias", 3},
      {"self_attention.linear_qkv.layer_norm_weight", 4}, {"self_attention.linear_qkv.layer_norm_bias", 5},
      {"self_attention.linear_qkv.weight", 6}, {"self_attention.linear_qkv.bias", 7},
      {"self_attention.q_layernorm.weight", 8}, {"self_attention.q_layernorm.bias", 9},
      {"self_attention.k_layernorm.weight", 10}, {"self_attention.k_layernorm.bias", 11},
      {"pre_mlp_layernorm.weight", 12}, {"pre_mlp_layernorm.bias", 13},
      {"mlp.linear_fc1.layer_norm_weight", 14}, {"mlp.linear_fc1.layer_norm_bias", 15},
      {"mlp.linear_fc1.weight", 16}, {"mlp.linear_fc1.bias", 17},
      {"mlp.linear_fc2.weight", 18}, {"mlp.linear_fc2.bias", 19},
      {"post_attn_norm.weight", 20}, {"post_attn_norm.bias", 21},
      {"post_mlp_layernorm.weight", 22}, {"post_mlp_layernorm.bias", 23}};
  const auto& table = te ? kTe : kLocal;
  auto it = table.find(sub);
  return it == table.end() ? -1 : it->second;
}

// GPTModel's registration order outside the layers: embedding, decoder (layers, final_layernorm), output_layer.
int top_rank(const std::string& key) {
  static const std::map<std::string, int> kTop = {
      {"embedding.word_embeddings.weight", 0}, {"embedding.position_embeddings.weight", 1},
      {"decoder.final_layernorm.weight", 3},   {"decoder.final_layernorm.bias", 4},
      {"output_layer.weight", 5},              {"output_layer.bias", 6}};
  auto it = kTop.find(key);
  return it == kTop.end() ? -1 : it->second;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// A bucket tensor's key split into its parts.
struct BucketKey {
  int64_t group = 0, gbuf = 0, bucket = 0;
  std::string dtype, state;
};

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](unsigned char ch) { return std::isdigit(ch); })) return false;
  *out = std::stoll(s);
  return true;
}

// optimizer.distributed.dp_group_idx_<G>.gbuf_idx_<I>.dtype_<D>.bucket_idx_<B>.<state> (D may hold dots).
bool parse_bucket_key(const std::string& key, BucketKey* k) {
  static const std::string kGroup = std::string(kBuckets) + "dp_group_idx_";
  if (!starts_with(key, kGroup)) return false;
  size_t at = kGroup.size(), dot = key.find('.', at);
  if (dot == std::string::npos || !parse_int(key.substr(at, dot - at), &k->group)) return false;
  at = dot + 1;
  if (!starts_with(key.substr(at), "gbuf_idx_")) return false;
  at += 9;
  dot = key.find('.', at);
  if (dot == std::string::npos || !parse_int(key.substr(at, dot - at), &k->gbuf)) return false;
  at = dot + 1;
  const size_t b = key.rfind(".bucket_idx_");
  if (!starts_with(key.substr(at), "dtype_") || b == std::string::npos || b < at + 6) return false;
  k->dtype = key.substr(at + 6, b - at - 6);
  at = b + 12;
  dot = key.find('.', at);
  if (dot == std::string::npos || !parse_int(key.substr(at, dot - at), &k->bucket)) return false;
  k->state = key.substr(dot + 1);
  return !k->state.empty();
}

// Megatron's DDP bucket size for the saving run (DistributedDataParallel / training.get_model): 0 = one bucket.
StatusOr<int64_t> saved_bucket_size(const PyValue* args, int64_t num_parameters, const std::string& where) {
  const PyValue* overlap = args ? args->attr("overlap_grad_reduce") : nullptr;
  const bool overlapped = overlap && overlap->kind == PyValue::kBool && overlap->b;
  int64_t configured = int_attr(args, "ddp_bucket_size", 0);
  if (const int64_t n = int_attr(args, "ddp_num_buckets", 0); configured <= 0 && n > 0)
    configured = std::max<int64_t>(1, num_parameters / n);
  const int64_t dp = int_attr(args, "data_parallel_size", 0), cp = int_attr(args, "context_parallel_size", 1),
                instances = std::max<int64_t>(1, int_attr(args, "num_distributed_optimizer_instances", 1));
  if (overlapped && configured <= 0 && dp <= 0)
    return DataLoss(where, ": Megatron's args record --overlap-grad-reduce without --ddp-bucket-size and no "
                           "data_parallel_size, which sets the bucket size of the saved optimizer buffers; ", kOutWay);
  return chunk_bucket_size(overlapped, 0, 0, std::max<int64_t>(1, dp * cp / instances), 0, configured);
}

// The saved per_bucket_numel_unpadded ([a list with, per buffer, {(param dtype, grad dtype): [per bucket]}]) of
// the one buffer, or nullopt when not saved.
StatusOr<std::optional<std::vector<int64_t>>> saved_unpadded(const DcpCheckpoint& c, const std::string& key,
                                                             int64_t gbuf, int64_t buffers) {
  if (!c.objects().count(key)) return std::optional<std::vector<int64_t>>();
  GALE_ASSIGN_OR_RETURN(PyRef v, c.read_object(key));
  if (v->kind == PyValue::kList && v->items.size() == 1 && v->items[0]->kind == PyValue::kList)
    v = v->items[0];  // Megatron's torch_dist stores a ShardedObject's data in a one-element list
  if ((v->kind == PyValue::kList || v->kind == PyValue::kTuple) && static_cast<int64_t>(v->items.size()) == buffers &&
      v->items[gbuf]->kind == PyValue::kDict && v->items[gbuf]->entries.size() == 1) {
    const PyValue& sizes = *v->items[gbuf]->entries[0].second;
    std::vector<int64_t> out;
    for (const PyRef& n : sizes.items)
      if (n->kind == PyValue::kInt) out.push_back(n->i);
    if (sizes.kind == PyValue::kList && out.size() == sizes.items.size())
      return std::optional<std::vector<int64_t>>(out);
  }
  return DataLoss(c.directory(), ": object '", key, "': expected a list with ", buffers, " {(param dtype, grad dtype): "
                  "[bucket sizes]} (one buffer per model chunk), found ", v->type_name(),
                  v->items.empty() ? "" : str_cat(" of ", v->items.size(), ", the first a ", v->items[0]->type_name(),
                                                  " of ", v->items[0]->entries.size() + v->items[0]->items.size()),
                  "; ", kOutWay);
}

std::string bucket_list(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += str_cat(i ? ", " : "", v[i]);
  return s + "]";
}

// Model-parallel rank `rank`'s piece of one layer's (or a top-level) tensor of shape `s`.
StatusOr<Shape> tp_piece(const std::string& key, Shape s, const MegatronModelRank& rank, const std::string& dir) {
  const MegatronSplit split = megatron_split_of(key, rank.swiglu);
  if (rank.tp_size == 1 || split == MegatronSplit::kReplicated) return s;
  const size_t dim = split == MegatronSplit::kColumns ? 1 : 0;
  const int64_t parts = split == MegatronSplit::kGatedRows ? 2 * rank.tp_size : rank.tp_size;
  if (s.size() <= dim || s[dim] % parts != 0)
    return DataLoss(dir, ": model tensor '", key, "' (one layer's shape ", shape_string(s),
                    "): expected its dimension ", dim, " to split into ", parts,
                    " equal tensor-parallel pieces (args.tensor_model_parallel_size ", rank.tp_size,
                    split == MegatronSplit::kGatedRows ? ", SwiGLU's gate and up halves" : "", "); ", kOutWay);
  s[dim] /= rank.tp_size;
  return s;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

const char kEmbedding[] = "embedding.word_embeddings.weight";

// Tied embeddings at PP > 1: the checkpoint saves the embedding alone (the last stage's output layer as its replica).
Status check_tied_checkpoint(const std::map<std::string, Shape>& shapes, const std::string& dir) {
  if (shapes.count("output_layer.weight") || !shapes.count(kEmbedding))
    return DataLoss(dir, ": Megatron's args record tied embeddings (no untie_embeddings_and_output_weights) at PP > 1, "
                    "but the checkpoint holds ", shapes.count(kEmbedding) ? "an output_layer.weight" : str_cat(
                    "no ", kEmbedding), ": expected the embedding alone (the last stage's output layer saved as its "
                    "replica); ", kOutWay);
  return Status::Ok();
}

std::map<std::string, Shape> shapes_of(const DcpCheckpoint& c) {
  std::map<std::string, Shape> out;
  for (const auto& [key, info] : c.tensors()) out[key] = info.shape;
  return out;
}

}  // namespace

StatusOr<std::vector<MegatronBucketParam>> megatron_parameter_order(const DcpCheckpoint& c, const std::string& impl,
                                                                    int64_t num_layers, const std::string& dir,
                                                                    const MegatronModelRank& rank) {
  return megatron_parameter_order(shapes_of(c), impl, num_layers, dir, rank);
}

StatusOr<std::vector<MegatronBucketParam>> megatron_parameter_order(const std::map<std::string, Shape>& shapes,
                                                                    const std::string& impl, int64_t num_layers,
                                                                    const std::string& dir,
                                                                    const MegatronModelRank& rank) {
  if (impl != "local" && impl != "transformer_engine")
    return Unimplemented(dir, ": Megatron's args.transformer_impl '", impl, "': expected 'local' or "
                         "'transformer_engine' (it sets the order of the parameters in the optimizer's buckets); ",
                         kOutWay);
  const bool te = impl == "transformer_engine";
  static const std::string kLayers = "decoder.layers.";
  // The stage's global layers [first, last).
  const int64_t first = rank.first_layer, last = rank.num_layers < 0 ? num_layers : rank.first_layer + rank.num_layers;
  std::vector<std::tuple<int, int64_t, int, MegatronBucketParam>> ranked;
  for (const auto& [key, shape] : shapes) {
    if (!model_key(key)) continue;
    if (!starts_with(key, kLayers)) {
      if (rank.experts) continue;  // the expert buffer holds the experts only
      const int r = top_rank(key);
      if (r < 0)
        return Unimplemented(dir, ": model tensor '", key, "': its place in Megatron's parameter order (which lays "
                             "out the distributed optimizer's buckets) is not known to Gale; ", kOutWay);
      if (r <= 1 ? !rank.first_stage : !rank.last_stage) continue;  // the embedding; the final norm, output layer
      GALE_ASSIGN_OR_RETURN(Shape piece, tp_piece(key, shape, rank, dir));
      ranked.emplace_back(r, 0, 0, MegatronBucketParam{key, -1, numel_of(piece), 0, 0, piece});
      // Tied at PP > 1: the first stage's word embedding is Megatron's shared_embedding.
      std::get<3>(ranked.back()).own_bucket =
          rank.tied_embeddings && r == 0 && rank.first_stage && !rank.last_stage;
      continue;
    }
    std::string sub = key.substr(kLayers.size());
    int64_t layer = -1;
    if (const size_t dot = sub.find('.'); dot != std::string::npos && parse_int(sub.substr(0, dot), &layer))
      sub = sub.substr(dot + 1);  // one key per layer
    if (expert_sub(sub) != rank.experts) continue;  // the other buffer's
    if (rank.experts) {
      // SequentialMLP's local experts in order, each registering linear_fc1 then linear_fc2 (weight, bias).
      static const std::map<std::string, int> kExpert = {{"mlp.experts.experts.linear_fc1.weight", 0},
                                                         {"mlp.experts.experts.linear_fc1.bias", 1},
                                                         {"mlp.experts.experts.linear_fc2.weight", 2},
                                                         {"mlp.experts.experts.linear_fc2.bias", 3}};
      auto it = kExpert.find(sub);
      if (te || it == kExpert.end() || layer >= 0)
        return Unimplemented(dir, ": model tensor '", key, "': its place in Megatron's expert buffer with "
                             "transformer_impl '", impl, "' is not known to Gale (it reads SequentialMLP's stacked "
                             "experts, mlp.experts.experts.linear_fc1/linear_fc2 [L, E, ...], of the local spec); ",
                             kOutWay);
      const int64_t experts = shape.size() > 2 ? shape[1] : 0;
      if (shape.size() < 3 || shape[0] != num_layers || experts % rank.ep_size != 0)
        return DataLoss(dir, ": model tensor '", key, "' of shape ", shape_string(shape), ": expected [num_layers ",
                        num_layers, ", experts divisible by args.expert_model_parallel_size ", rank.ep_size, ", ...]; ",
                        kOutWay);
      const Shape piece(shape.begin() + 2, shape.end());
      const int64_t local = experts / rank.ep_size;
      for (int64_t l = std::max<int64_t>(first, 0); l < std::min(last, num_layers); ++l)
        for (int64_t j = 0; j < local; ++j) {
          MegatronBucketParam q{key, l, numel_of(piece), 0, 0, piece};
          q.expert = rank.ep_rank * local + j;
          ranked.emplace_back(2, l, static_cast<int>(4 * j + it->second), std::move(q));
        }
      continue;
    }
    const int r = layer_rank(sub, te);
    if (r < 0)
      return Unimplemented(dir, ": model tensor '", key, "': its place in Megatron's parameter order with "
                           "transformer_impl '", impl, "' (which lays out the distributed optimizer's buckets) is not "
                           "known to Gale; ", kOutWay);
    if (layer >= 0) {
      if (layer < first || layer >= last) continue;  // another stage's
      GALE_ASSIGN_OR_RETURN(Shape piece, tp_piece(key, shape, rank, dir));
      ranked.emplace_back(2, layer, r, MegatronBucketParam{key, -1, numel_of(piece), 0, 0, piece});
      continue;
    }
    if (shape.empty() || shape[0] != num_layers)
      return DataLoss(dir, ": model tensor '", key, "' of shape ", shape_string(shape), ": expected the layers "
                      "stacked along its first dimension (args.num_layers = ", num_layers, ")");
    GALE_ASSIGN_OR_RETURN(Shape piece, tp_piece(key, Shape(shape.begin() + 1, shape.end()), rank, dir));
    for (int64_t l = std::max<int64_t>(first, 0); l < std::min(last, num_layers); ++l)
      ranked.emplace_back(2, l, r, MegatronBucketParam{key, l, numel_of(piece), 0, 0, piece});
  }
  // Tied embeddings: the last stage's copy of the word embedding (GPTModel's output_layer.weight, which the checkpoint
  // saves as a replica of the embedding) sits at the output layer's place.
  if (rank.tied_embeddings && rank.last_stage && !rank.first_stage) {
    GALE_RETURN_IF_ERROR(check_tied_checkpoint(shapes, dir));
    GALE_ASSIGN_OR_RETURN(Shape piece, tp_piece(kEmbedding, shapes.at(kEmbedding), rank, dir));
    ranked.emplace_back(top_rank("output_layer.weight"), 0, 0,
                        MegatronBucketParam{kEmbedding, -1, numel_of(piece), 0, 0, piece, /*own_bucket=*/true});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  std::vector<MegatronBucketParam> out;
  for (auto& r : ranked) out.push_back(std::move(std::get<3>(r)));
  return out;
}

MegatronBucketLayout megatron_bucket_layout(std::vector<MegatronBucketParam> params, int64_t bucket_size) {
  // _ParamAndGradBuffer with the distributed optimizer: parameters in reverse order, each starting at a
  // multiple of 64 elements; a bucket closes after the parameter that brings it to bucket_size elements and the
  // next starts at a multiple of lcm(DP, 128) (a multiple of 64, so offsets within a bucket do not depend on DP).
  MegatronBucketLayout l;
  std::reverse(params.begin(), params.end());
  int64_t at = 0, bucket_begin = 0, end = 0;
  int bucket = 0;
  bool open = false;
  for (MegatronBucketParam& p : params) {
    at = round_up(at, 64);
    if (p.own_bucket && open) {  // the open bucket ends where the shared embedding would start
      l.bucket_numel_unpadded.push_back(at - bucket_begin);
      bucket_begin = at = round_up(at, 128);
      ++bucket;
      open = false;
    }
    p.bucket = bucket;
    p.begin = at - bucket_begin;
    end = at + p.numel;
    open = true;
    if ((bucket_size > 0 && end - bucket_begin >= bucket_size) || p.own_bucket) {
      l.bucket_numel_unpadded.push_back(end - bucket_begin);
      bucket_begin = at = round_up(end, 128);
      ++bucket;
      open = false;
    } else {
      at = end;
    }
  }
  if (open) l.bucket_numel_unpadded.push_back(end - bucket_begin);
  l.params = std::move(params);
  return l;
}

namespace {

// The elements of every bucket of one state, from wherever the layout keeps them.
using BucketSource = std::function<StatusOr<std::vector<float>>(const std::string& state, int64_t bucket)>;

StatusOr<std::vector<float>> f32_elements(const Tensor& t, const std::string& what) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  GALE_RETURN_IF_ERROR(convert_elements(st_dtype_of(t.dtype()), t.raw(), DType::kF32, f.data(), t.numel(), what));
  return f;
}

// dp_reshardable: one tensor per bucket and state of model-parallel rank `group`'s buffer (`states` gets their
// names, the masters as fp32_param); other ranks' tensors are skipped.
StatusOr<BucketSource> bucket_tensors(const DcpCheckpoint& c, const MegatronBucketLayout& layout, int64_t group,
                                      const std::string& what, std::vector<std::string>* states,
                                      const std::string& prefix, int64_t gbuf, int64_t buffers) {
  auto keys = std::make_shared<std::map<std::string, std::map<int64_t, std::string>>>();  // state -> bucket -> key
  std::string dtype;
  for (const auto& [key, info] : c.tensors()) {
    if (!starts_with(key, prefix + kBuckets)) continue;
    BucketKey k;
    if (!parse_bucket_key(key.substr(prefix.size()), &k))
      return DataLoss(c.directory(), ": optimizer tensor '", key, "': expected optimizer.distributed.dp_group_idx_<G>."
                      "gbuf_idx_<I>.dtype_<D>.bucket_idx_<B>.<state>");
    if (k.group != group) continue;
    if (k.gbuf >= buffers || (k.gbuf == gbuf && !dtype.empty() && k.dtype != dtype))
      return Unimplemented(what, ": several gradient buffers (tensor '", key, "': several parameter dtypes, or more "
                           "model chunks than the ", buffers, " the saved args give): not supported yet; ", kOutWay);
    if (k.gbuf != gbuf) continue;  // another model chunk's buffer
    dtype = k.dtype;
    (*keys)[k.state == "param" ? "fp32_param" : k.state][k.bucket] = key;
  }
  if (keys->empty())
    return DataLoss(what, ": expected its bucket tensors (", prefix, "optimizer.distributed.dp_group_idx_", group,
                    ".gbuf_idx_", gbuf, ".dtype_<D>.bucket_idx_<B>.param / exp_avg / exp_avg_sq), found none; ", kOutWay);
  const int64_t buckets = static_cast<int64_t>(layout.bucket_numel_unpadded.size());
  for (const auto& [state, by_bucket] : *keys) {
    states->push_back(state);
    for (int64_t b = 0; b < buckets; ++b)
      if (!by_bucket.count(b))
        return DataLoss(what, ": no '", state == "fp32_param" ? "param" : state, "' tensor for bucket ", b, " of the ",
                        buckets, " the saved args give; ", kOutWay);
    if (by_bucket.rbegin()->first >= buckets)
      return DataLoss(what, ": tensor '", by_bucket.rbegin()->second, "' beyond the ", buckets, " buckets the saved "
                      "args give (bucket sizes ", bucket_list(layout.bucket_numel_unpadded), "); ", kOutWay);
  }
  return BucketSource([&c, keys, &layout](const std::string& state, int64_t b) -> StatusOr<std::vector<float>> {
    const std::string& key = keys->at(state).at(b);
    GALE_ASSIGN_OR_RETURN(Tensor t, c.read_tensor(key));
    if (t.numel() < layout.bucket_numel_unpadded[b])
      return DataLoss(c.directory(), ": optimizer tensor '", key, "' holds ", t.numel(), " elements: expected at "
                      "least the ", layout.bucket_numel_unpadded[b], " of bucket ", b, " in the buffer layout of the "
                      "saved args; ", kOutWay);
    return f32_elements(t, key);
  });
}

// dp_zero_gather_scatter: one object, {'buckets_coalesced': True, 0: {(param dtype, grad dtype): {'param',
// 'exp_avg', 'exp_avg_sq': the buckets' unpadded elements one after another, 'numel_unpadded'}}}.
// Model-parallel rank `group`'s object optimizer.distributed.dp_group_idx_<group>.param_state.
StatusOr<BucketSource> gathered_buffers_of(PyRef v, const MegatronBucketLayout& layout, const std::string& key,
                                           const std::string& what, std::vector<std::string>* states, int64_t gbuf,
                                           int64_t buffers);

StatusOr<BucketSource> gathered_buffers(const DcpCheckpoint& c, const MegatronBucketLayout& layout, int64_t group,
                                        const std::string& what, std::vector<std::string>* states,
                                        const std::string& prefix, int64_t gbuf, int64_t buffers) {
  const std::string key = str_cat(prefix, kBuckets, "dp_group_idx_", group, ".param_state/shard_0_1");
  if (!c.objects().count(key))
    return DataLoss(what, ": expected the object '", key, "' (the gathered buffers), found none; ", kOutWay);
  GALE_ASSIGN_OR_RETURN(PyRef v, c.read_object(key));
  if (v->kind == PyValue::kList && v->items.size() == 1) v = v->items[0];  // a ShardedObject's one-element list
  return gathered_buffers_of(v, layout, key, what, states, gbuf, buffers);
}

// get_parameter_state_dp_zero's dict `v` (named `key` in errors); buffer `gbuf` of `buffers`.
StatusOr<BucketSource> gathered_buffers_of(PyRef v, const MegatronBucketLayout& layout, const std::string& key,
                                           const std::string& what, std::vector<std::string>* states, int64_t gbuf,
                                           int64_t buffers) {
  const PyValue* per_dtype = nullptr;
  for (const auto& [k, x] : v->entries)
    if (k->kind == PyValue::kInt) {
      if (k->i < 0 || k->i >= buffers || x->kind != PyValue::kDict || x->entries.size() != 1)
        return Unimplemented(what, ": several gradient buffers (MoE expert parameters or several parameter dtypes): "
                             "not supported yet; ", kOutWay);
      if (k->i == gbuf) per_dtype = x->entries[0].second.get();
    }
  if (v->kind != PyValue::kDict || per_dtype == nullptr || per_dtype->kind != PyValue::kDict)
    return DataLoss(what, ": object '", key, "': expected {0: {(param dtype, grad dtype): {'param', 'exp_avg', "
                    "'exp_avg_sq', 'numel_unpadded'}}}, found a ", v->type_name(), "; ", kOutWay);
  const int64_t total = std::accumulate(layout.bucket_numel_unpadded.begin(), layout.bucket_numel_unpadded.end(),
                                        int64_t{0});
  auto world = std::make_shared<std::map<std::string, std::vector<float>>>();
  for (const auto& [k, x] : per_dtype->entries) {
    if (k->kind != PyValue::kString || x->kind != PyValue::kTensor) continue;
    const std::string state = k->s == "param" ? "fp32_param" : k->s;
    if (x->data.numel() != total)
      return DataLoss(what, ": the gathered '", k->s, "' holds ", x->data.numel(), " elements: expected the ", total,
                      " of the buffer layout Gale rebuilt from the saved args (bucket sizes ",
                      bucket_list(layout.bucket_numel_unpadded), "); ", kOutWay);
    GALE_ASSIGN_OR_RETURN((*world)[state], f32_elements(x->data, key + " " + k->s));
    states->push_back(state);
  }
  if (world->empty())
    return DataLoss(what, ": object '", key, "' holds no 'param' / 'exp_avg' / 'exp_avg_sq' tensors; ", kOutWay);
  std::vector<int64_t> begin(layout.bucket_numel_unpadded.size(), 0);
  for (size_t b = 1; b < begin.size(); ++b) begin[b] = begin[b - 1] + layout.bucket_numel_unpadded[b - 1];
  return BucketSource([world, begin, &layout](const std::string& state, int64_t b) -> StatusOr<std::vector<float>> {
    const std::vector<float>& w = world->at(state);
    return std::vector<float>(w.begin() + begin[b], w.begin() + begin[b] + layout.bucket_numel_unpadded[b]);
  });
}

}  // namespace

namespace {

// The text of an args attribute that is set (not absent, None or False), else empty.
std::string set_attr(const PyValue* args, const char* name) {
  const PyValue* v = args ? args->attr(name) : nullptr;
  if (v == nullptr || v->kind == PyValue::kNone || (v->kind == PyValue::kBool && !v->b)) return "";
  if (v->kind == PyValue::kInt) return std::to_string(v->i);
  if (v->kind == PyValue::kBool) return "True";
  if (v->kind == PyValue::kString) return "'" + v->s + "'";
  return v->type_name();
}

// Layer `layer` of a stacked tensor (-1: the whole tensor); with `expert` >= 0 its [layer][expert] slice of stacked
// experts [L, E, ...].
Tensor layer_slice(const Tensor& w, int64_t layer, int64_t expert = -1) {
  if (layer < 0) return w;
  const size_t drop = expert >= 0 ? 2 : 1;
  Tensor out = Tensor::empty(Shape(w.shape().begin() + drop, w.shape().end()), w.dtype());
  const int64_t index = expert >= 0 ? layer * w.shape()[1] + expert : layer;
  const size_t bytes = static_cast<size_t>(out.numel() * dtype_size(w.dtype()));
  std::memcpy(out.raw(), static_cast<const char*>(w.raw()) + static_cast<size_t>(index) * bytes, bytes);
  return out;
}

using RankState = MegatronRankState;

// Every bucket of `states` cut into the parameters of `layout`.
StatusOr<RankState> cut_buckets(const BucketSource& source, const std::vector<std::string>& states,
                                const MegatronBucketLayout& layout) {
  RankState local;
  for (const std::string& state : states)
    for (int64_t b = 0; b < static_cast<int64_t>(layout.bucket_numel_unpadded.size()); ++b) {
      GALE_ASSIGN_OR_RETURN(std::vector<float> f, source(state, b));
      for (const MegatronBucketParam& q : layout.params) {
        if (q.bucket != b) continue;
        Tensor x = Tensor::empty(q.shape, DType::kF32);
        std::memcpy(x.data<float>(), f.data() + q.begin, static_cast<size_t>(q.numel) * sizeof(float));
        local[state][{q.key, q.layer, q.expert}] = std::move(x);
      }
    }
  return local;
}

}  // namespace

StatusOr<std::vector<int64_t>> megatron_stage_layers(const PyValue* args, int64_t pp, int64_t num_layers,
                                                     const std::string& what) {
  const auto flag_on = [&](const char* name) {
    const PyValue* v = args ? args->attr(name) : nullptr;
    return v && v->kind == PyValue::kBool && v->b;
  };
  const int64_t first = int_attr(args, "decoder_first_pipeline_num_layers", -1);
  const int64_t last = int_attr(args, "decoder_last_pipeline_num_layers", -1);
  const int64_t embedding = flag_on("account_for_embedding_in_pipeline_split") ? 1 : 0;
  const int64_t loss = flag_on("account_for_loss_in_pipeline_split") ? 1 : 0;
  const std::string args_text =
      str_cat("args.num_layers ", num_layers, ", pipeline_model_parallel_size ", pp,
              first >= 0 ? str_cat(", decoder_first_pipeline_num_layers ", first) : std::string(),
              last >= 0 ? str_cat(", decoder_last_pipeline_num_layers ", last) : std::string(),
              embedding ? ", account_for_embedding_in_pipeline_split" : "",
              loss ? ", account_for_loss_in_pipeline_split" : "");
  auto refuse = [&](const std::string& why) {
    return DataLoss(what, ": Megatron's ", args_text, ": ", why, " (Megatron's own pipeline split refuses them); ",
                    kOutWay);
  };
  if (num_layers < 1) return refuse("expected num_layers >= 1");
  std::vector<int64_t> out(static_cast<size_t>(pp));
  if (first >= 0 || last >= 0) {
    if (embedding + loss > 0) return refuse("expected the first/last stage sizes or the account_for flags, not both");
    const int64_t middle_stages = pp - (first >= 0 ? 1 : 0) - (last >= 0 ? 1 : 0);
    const int64_t middle_layers = num_layers - std::max<int64_t>(first, 0) - std::max<int64_t>(last, 0);
    if (middle_layers < 0 || (middle_stages == 0 ? middle_layers != 0 : middle_layers % middle_stages != 0))
      return refuse(str_cat("expected the ", middle_layers, " other layers to split evenly over the ", middle_stages,
                            " other stages"));
    std::fill(out.begin(), out.end(), middle_stages > 0 ? middle_layers / middle_stages : 0);
    if (first >= 0) out.front() = first;
    if (last >= 0) out.back() = last;
  } else if (embedding + loss > 0) {  // the embedding and the loss each count as a layer of the first / last stage
    if ((num_layers + embedding + loss) % pp != 0)
      return refuse("expected num_layers plus the accounted embedding and loss to divide by PP");
    std::fill(out.begin(), out.end(), (num_layers + embedding + loss) / pp);
    out.front() -= embedding;
    out.back() -= loss;
  } else {
    if (num_layers % pp != 0) return refuse("expected num_layers divisible by PP");
    std::fill(out.begin(), out.end(), num_layers / pp);
  }
  return out;
}

Status read_megatron_bucket_state(const DcpCheckpoint& c, const PyValue* args, const std::string& dir,
                                  MegatronOptimizerState* o) {
  const std::string what = str_cat(dir, ": Megatron's distributed optimizer state in the '", o->layout, "' layout");
  const int64_t tp = int_attr(args, "tensor_model_parallel_size", 1);
  const int64_t pp = int_attr(args, "pipeline_model_parallel_size", 1);
  const int64_t num_layers = int_attr(args, "num_layers", -1);
  if (tp < 1 || pp < 1)
    return DataLoss(what, ": Megatron's args record tensor_model_parallel_size ", tp,
                    " and pipeline_model_parallel_size ", pp, ": expected both >= 1; ", kOutWay);
  // MoE: Megatron's ChainedOptimizer [dense, experts], each optimizer's buffers under its chained_<i>. prefix.
  const int64_t num_experts = int_attr(args, "num_experts", 0);
  const bool chained = num_experts > 0;
  const int64_t ep = std::max<int64_t>(1, int_attr(args, "expert_model_parallel_size", 1));
  if (chained) {
    if (const int64_t etp = int_attr(args, "expert_tensor_parallel_size", 1); etp != 1)
      return Unimplemented(what, " with args.expert_tensor_parallel_size ", etp, ": not supported yet (Gale rebuilds "
                           "the expert buffers of whole experts, expert TP 1); ", kOutWay);
    bool dense = false, experts = false;
    for (const auto& [key, info] : c.tensors()) {
      dense = dense || starts_with(key, std::string("chained_0.") + kBuckets);
      experts = experts || starts_with(key, std::string("chained_1.") + kBuckets);
    }
    for (const auto& [key, info] : c.objects()) {
      dense = dense || starts_with(key, std::string("chained_0.") + kBuckets);
      experts = experts || starts_with(key, std::string("chained_1.") + kBuckets);
    }
    if (!dense || !experts)
      return DataLoss(what, ": Megatron's args record args.num_experts ", num_experts, ", whose chained dense and "
                      "expert optimizers save their buffers under chained_0.", kBuckets, "* and chained_1.", kBuckets,
                      "*: found ", dense ? "" : "no chained_0. ", !dense && !experts ? "and " : "",
                      experts ? "" : "no chained_1. ", "entries; ", kOutWay);
  }
  const PyValue* untie = args ? args->attr("untie_embeddings_and_output_weights") : nullptr;
  const bool tied = !(untie && untie->kind == PyValue::kBool && untie->b);
  std::vector<int64_t> stage_layers(static_cast<size_t>(pp), pp > 1 ? num_layers / pp : -1);
  int64_t chunks = 1, chunk_layers = -1;  // virtual pipeline chunks per stage and their layers
  if (pp > 1) {
    if (const std::string v = set_attr(args, "pipeline_model_parallel_layout"); !v.empty())
      return Unimplemented(what, " saved at PP ", pp, " with args.pipeline_model_parallel_layout ", v, ": not "
                           "supported yet (Gale rebuilds the buffers of even virtual pipeline chunks); ", kOutWay);
    GALE_ASSIGN_OR_RETURN(stage_layers, megatron_stage_layers(args, pp, num_layers, what));
    chunks = std::max<int64_t>(1, int_attr(args, "virtual_pipeline_model_parallel_size", 1));
    if (const int64_t n = int_attr(args, "num_layers_per_virtual_pipeline_stage", 0); n > 0 && chunks == 1 &&
        num_layers % (n * pp) == 0)
      chunks = num_layers / (n * pp);
    if (chunks > 1) {
      const std::string why =
          num_layers % (pp * chunks) != 0 ? str_cat("args.num_layers ", num_layers, " not divisible by PP x chunks")
          : chained                       ? std::string("MoE expert buffers per chunk")
          : tied                          ? std::string("tied embeddings")
          : !set_attr(args, "decoder_first_pipeline_num_layers").empty() ||
                  !set_attr(args, "decoder_last_pipeline_num_layers").empty() ||
                  !set_attr(args, "account_for_embedding_in_pipeline_split").empty() ||
                  !set_attr(args, "account_for_loss_in_pipeline_split").empty()
              ? std::string("an uneven pipeline split")
              : std::string();
      if (!why.empty())
        return Unimplemented(what, " saved at PP ", pp, " with ", chunks, " virtual pipeline chunks and ", why,
                             ": not supported yet (Gale rebuilds the buffers of even virtual pipeline chunks of a "
                             "dense model with untied embeddings); ", kOutWay);
      chunk_layers = num_layers / (pp * chunks);
    }
  }
  if (tied && pp > 1) GALE_RETURN_IF_ERROR(check_tied_checkpoint(shapes_of(c), dir));  // before the first stage's buckets
  const PyValue* impl = args ? args->attr("transformer_impl") : nullptr;
  if (impl == nullptr || impl->kind != PyValue::kString)
    return Unimplemented(what, ": Megatron's args record no transformer_impl, which sets the order of the "
                         "parameters in the buckets; ", kOutWay);
  for (const auto& [key, info] : c.tensors()) {  // every rank's buffers, and no other
    BucketKey k;
    const bool experts = starts_with(key, "chained_1.");
    const std::string rest = chained && (experts || starts_with(key, "chained_0.")) ? key.substr(10) : key;
    const int64_t groups = experts ? ep * pp : tp * pp;
    if (starts_with(rest, kBuckets) && parse_bucket_key(rest, &k) && k.group >= groups)
      return DataLoss(what, ": optimizer tensor '", key, "': expected dp_group_idx_0 to ", groups - 1, " (one per ",
                      experts ? "expert " : "", "model-parallel rank of the saved args' ",
                      experts ? str_cat("EP ", ep) : str_cat("TP ", tp), " x PP ", pp, "); ", kOutWay);
  }
  const auto flag_on = [&](const char* name) {
    const PyValue* v = args ? args->attr(name) : nullptr;
    return v && v->kind == PyValue::kBool && v->b;
  };
  const bool gated = flag_on("swiglu") || flag_on("quick_geglu") || flag_on("geglu") ||
                     flag_on("gelu_tanh");  // fc1 [gate; linear half] per rank
  std::map<std::string, Tensor> weights;  // the saved weights, read once
  std::map<std::string, std::map<std::string, Tensor>> global;  // state -> model key -> global tensor
  // One model-parallel rank's buffers (under `prefix`, dp_group_idx_<group>) cut into its parameters, its masters
  // checked against its piece of the weights.
  // With virtual pipeline chunks, chunk `gbuf` of `buffers` (gbuf_idx_<chunk>); Megatron buckets the first chunk only.
  auto read_rank = [&](const std::string& prefix, int64_t group, const MegatronModelRank& rank,
                       const std::string& rank_what, int64_t gbuf = 0, int64_t buffers = 1) -> StatusOr<RankState> {
    GALE_ASSIGN_OR_RETURN(std::vector<MegatronBucketParam> order,
                          megatron_parameter_order(c, impl->s, num_layers, dir, rank));
    int64_t num_parameters = 0;
    for (const MegatronBucketParam& q : order) num_parameters += q.numel;
    GALE_ASSIGN_OR_RETURN(int64_t bucket_size, saved_bucket_size(args, num_parameters, dir + "/common.pt"));
    if (gbuf > 0) bucket_size = 0;  // training.get_model: disable_bucketing for the chunks after the first
    const MegatronBucketLayout layout = megatron_bucket_layout(std::move(order), bucket_size);
    const std::string size_text = bucket_size > 0 ? str_cat("bucket size ", bucket_size) : "one bucket";
    const std::string sizes_key =
        str_cat(prefix, kBuckets, "dp_group_idx_", group, ".per_bucket_numel_unpadded/shard_0_1");
    GALE_ASSIGN_OR_RETURN(auto saved, saved_unpadded(c, sizes_key, gbuf, buffers));
    if (saved && *saved != layout.bucket_numel_unpadded)
      return DataLoss(rank_what, ": the saved bucket sizes ", bucket_list(*saved), " (", sizes_key,
                      buffers > 1 ? str_cat(", buffer ", gbuf) : "",
                      ") differ from the ", bucket_list(layout.bucket_numel_unpadded),
                      " of the buffer layout Gale rebuilt from the saved args (", size_text, ", transformer_impl '",
                      impl->s, "'); ", kOutWay);
    std::vector<std::string> states;
    GALE_ASSIGN_OR_RETURN(BucketSource source, o->layout == "dp_zero_gather_scatter"
                                                   ? gathered_buffers(c, layout, group, rank_what, &states, prefix,
                                                                      gbuf, buffers)
                                                   : bucket_tensors(c, layout, group, rank_what, &states, prefix,
                                                                    gbuf, buffers));
    GALE_ASSIGN_OR_RETURN(RankState local, cut_buckets(source, states, layout));
    // The masters, rounded to the weights' dtype, are this rank's piece of the saved weights: proof that the
    // layout is Megatron's.
    auto masters = local.find("fp32_param");
    if (masters == local.end())
      return DataLoss(rank_what, ": no 'param' bucket tensors (the fp32 master copies); ", kOutWay);
    for (const auto& [at, m] : masters->second) {
      const auto& [key, layer, expert] = at;
      if (!weights.count(key)) {
        GALE_ASSIGN_OR_RETURN(weights[key], c.read_tensor(key));
      }
      GALE_ASSIGN_OR_RETURN(Tensor w, megatron_cut_tp(layer_slice(weights.at(key), layer, expert),
                                                      megatron_split_of(key, gated), rank.tp_size, rank.tp_rank, key));
      Tensor r = Tensor::empty(w.shape(), w.dtype());
      GALE_RETURN_IF_ERROR(convert_elements(st_dtype_of(DType::kF32), m.raw(), w.dtype(), r.raw(), m.numel(), key));
      const int64_t esize = dtype_size(w.dtype());
      int64_t differ = 0, first = -1;
      for (int64_t i = 0; i < w.numel(); ++i)
        if (std::memcmp(static_cast<const char*>(r.raw()) + i * esize, static_cast<const char*>(w.raw()) + i * esize,
                        static_cast<size_t>(esize)) != 0) {
          if (first < 0) first = i;
          ++differ;
        }
      if (differ > 0)
        return DataLoss(rank_what, ": the fp32 master copies that the buffer layout rebuilt from the saved args (",
                        size_text, ", transformer_impl '", impl->s, "') places at '", key, "'",
                        layer >= 0 ? str_cat(" (layer ", layer, expert >= 0 ? str_cat(", expert ", expert) : "", ")")
                                   : std::string(),
                        " are not its saved weights (", differ, " of ", w.numel(),
                        " elements differ, the first at flat index ", first, "): the layout is not the saving run's; ",
                        kOutWay);
    }
    return local;
  };
  // A stage's TP pieces merged (SwiGLU's gate and up halves separately), in place at their global layers (and
  // experts).
  auto merge = [&](const std::vector<RankState>& stage, int64_t p) -> Status {
    const int64_t pieces_tp = static_cast<int64_t>(stage.size());
    for (const auto& [state, pieces] : stage[0])
      for (const auto& [at, piece0] : pieces) {
        const auto& [key, layer, expert] = at;
        std::vector<Tensor> parts;
        for (int64_t t = 0; t < pieces_tp; ++t) {
          auto s = stage[t].find(state);
          if (s == stage[t].end() || !s->second.count(at))
            return DataLoss(what, ": tensor-parallel rank ", t, " of pipeline rank ", p, " holds no '",
                            state == "fp32_param" ? "param" : state, "' state of '", key, "' (rank 0 does); ", kOutWay);
          parts.push_back(s->second.at(at));
        }
        GALE_ASSIGN_OR_RETURN(Tensor whole, megatron_merge_tp(parts, megatron_split_of(key, gated), key, what));
        Tensor& dst = global[state][key];
        if (tied && pp > 1 && p == pp - 1 && key == kEmbedding) {
          // The last stage's copy of the tied embedding: Megatron all-reduces both copies' gradients over the
          // embedding group, so its state must be the first stage's, bit for bit.
          if (!dst.defined() || dst.numel() != whole.numel() ||
              std::memcmp(dst.raw(), whole.raw(), static_cast<size_t>(whole.numel()) * sizeof(float)) != 0) {
            int64_t differ = 0;
            for (int64_t i = 0; dst.defined() && i < std::min(dst.numel(), whole.numel()); ++i)
              differ += dst.data<float>()[i] != whole.data<float>()[i];
            return DataLoss(what, ": the last pipeline stage's copy of the tied word embedding (its output_layer."
                            "weight) holds another '", state == "fp32_param" ? "param" : state, "' state than the "
                            "first stage's embedding (", differ, " of ", whole.numel(), " elements differ): expected "
                            "equal copies, as Megatron keeps them; ", kOutWay);
          }
          continue;
        }
        const Shape& full = c.tensors().at(key).shape;
        if (!dst.defined()) dst = Tensor::zeros(full, DType::kF32);
        const int64_t slices = layer < 0 ? 1 : expert >= 0 ? full[0] * full[1] : full[0];
        if (whole.numel() * slices != dst.numel())
          return DataLoss(what, ": the merged '", state, "' of '", key, "' has shape ", whole.shape_string(),
                          ": expected ", layer >= 0 ? (expert >= 0 ? "one expert of one layer of " : "one layer of ")
                                                    : "", shape_string(full));
        const int64_t index = layer < 0 ? 0 : expert >= 0 ? layer * full[1] + expert : layer;
        std::memcpy(dst.data<float>() + index * whole.numel(), whole.data<float>(),
                    static_cast<size_t>(whole.numel()) * sizeof(float));
      }
    return Status::Ok();
  };
  // Megatron's ChainedOptimizer (MoE): the dense optimizer's buffers under chained_0., the experts' under chained_1.
  const std::string dense_prefix = chained ? "chained_0." : "";
  for (int64_t p = 0; p < pp; ++p) {
    std::vector<RankState> stage;  // by tensor-parallel rank
    for (int64_t t = 0; t < tp; ++t) {
      const int64_t group = t + tp * p;  // DistributedOptimizer's data_parallel_group_idx
      std::string rank_what =
          tp * pp > 1 ? str_cat(what, ", tensor-parallel rank ", t, " of ", tp, ", pipeline rank ", p, " of ", pp)
                      : what;
      if (chained) rank_what += ", dense optimizer (chained_0)";
      MegatronModelRank rank;
      rank.tp_size = tp;
      rank.tp_rank = t;
      rank.num_layers = stage_layers[static_cast<size_t>(p)];
      for (int64_t q = 0; q < p; ++q) rank.first_layer += stage_layers[static_cast<size_t>(q)];
      rank.first_stage = p == 0;
      rank.last_stage = p == pp - 1;
      rank.swiglu = gated;
      rank.tied_embeddings = tied;
      if (chunks == 1) {
        GALE_ASSIGN_OR_RETURN(RankState local, read_rank(dense_prefix, group, rank, rank_what));
        stage.push_back(std::move(local));
        continue;
      }
      // Virtual pipeline chunks: chunk v of pipeline rank p is virtual stage v·PP + p (its layers
      // [(v·PP + p)·n, +n)); the embedding in the first chunk of the first rank, the final norm and output layer in
      // the last chunk of the last rank; one buffer per chunk (gbuf_idx_<v>).
      RankState merged;
      for (int64_t v = 0; v < chunks; ++v) {
        rank.num_layers = chunk_layers;
        rank.first_layer = (v * pp + p) * chunk_layers;
        rank.first_stage = p == 0 && v == 0;
        rank.last_stage = p == pp - 1 && v == chunks - 1;
        GALE_ASSIGN_OR_RETURN(RankState local,
                              read_rank(dense_prefix, group, rank, str_cat(rank_what, ", model chunk ", v), v, chunks));
        for (auto& [state, pieces] : local)
          for (auto& [at, x] : pieces) merged[state][at] = std::move(x);
      }
      stage.push_back(std::move(merged));
    }
    GALE_RETURN_IF_ERROR(merge(stage, p));
  }
  // The expert optimizer: expert model-parallel rank e + EP·p (its rank in Megatron's tp-ep-pp expert group at expert
  // TP 1) holds the E / EP local experts of EP rank e, whole, of stage p's layers.
  for (int64_t p = 0; chained && p < pp; ++p)
    for (int64_t e = 0; e < ep; ++e) {
      MegatronModelRank rank;
      rank.num_layers = stage_layers[static_cast<size_t>(p)];
      for (int64_t q = 0; q < p; ++q) rank.first_layer += stage_layers[static_cast<size_t>(q)];
      rank.first_stage = p == 0;
      rank.last_stage = p == pp - 1;
      rank.swiglu = gated;
      rank.experts = true;
      rank.ep_size = ep;
      rank.ep_rank = e;
      const std::string rank_what = str_cat(what, ", expert optimizer (chained_1), expert-parallel rank ", e, " of ",
                                            ep, ", pipeline rank ", p, " of ", pp);
      GALE_ASSIGN_OR_RETURN(RankState local, read_rank("chained_1.", e + ep * p, rank, rank_what));
      GALE_RETURN_IF_ERROR(merge({std::move(local)}, p));
    }
  for (auto& [state, by_key] : global) o->tensors[state] = std::move(by_key);
  return Status::Ok();
}

StatusOr<int64_t> megatron_saved_bucket_size(const PyValue* args, int64_t num_parameters, const std::string& where) {
  return saved_bucket_size(args, num_parameters, where);
}

StatusOr<MegatronRankState> megatron_split_dp_zero(const PyRef& state, const MegatronBucketLayout& layout,
                                                   const std::string& file, const std::string& what, int64_t gbuf,
                                                   int64_t buffers) {
  std::vector<std::string> states;
  GALE_ASSIGN_OR_RETURN(BucketSource source, gathered_buffers_of(state, layout, file, what, &states, gbuf, buffers));
  return cut_buckets(source, states, layout);
}

}  // namespace gale
