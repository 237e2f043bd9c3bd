// Tensor renaming and re-layout between Hugging Face and Gale checkpoints.
#include "train/hf_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "train/hf_deepseek_v32.h"

namespace gale {

namespace {

// Rows of a [rows, cols] tensor (a 1-D tensor is [n, 1]).
int64_t cols_of(const Tensor& t) { return t.ndim() == 1 ? 1 : t.size(1); }

Tensor transpose(const Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1);
  Tensor out = Tensor::empty({c, r});
  const float* s = t.data<float>();
  float* d = out.data<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) d[j * r + i] = s[i * c + j];
  return out;
}

// Rows [first, first + n) of t, copied.
Tensor rows(const Tensor& t, int64_t first, int64_t n) {
  Shape shape = t.shape();
  shape[0] = n;
  Tensor out = Tensor::empty(shape);
  std::memcpy(out.data<float>(), t.data<float>() + first * cols_of(t), static_cast<size_t>(n * cols_of(t)) * 4);
  return out;
}

// Copies `n` rows starting at `from` of `src` to row `to` of `dst` (same column count).
void copy_rows(const Tensor& src, int64_t from, Tensor& dst, int64_t to, int64_t n) {
  const int64_t c = cols_of(src);
  std::memcpy(dst.data<float>() + to * c, src.data<float>() + from * c, static_cast<size_t>(n * c) * 4);
}

Tensor concat_rows(const std::vector<Tensor>& parts) {
  Shape shape = parts.front().shape();
  shape[0] = 0;
  for (const Tensor& p : parts) shape[0] += p.size(0);
  Tensor out = Tensor::empty(shape);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    copy_rows(p, 0, out, at, p.size(0));
    at += p.size(0);
  }
  return out;
}

// t with copies of its last row appended up to `n` rows: the padded vocabulary, filled as
// Megatron's checkpoint converter fills it.
Tensor pad_rows(const Tensor& t, int64_t n) {
  Shape shape = t.shape();
  shape[0] = n;
  Tensor out = Tensor::empty(shape);
  copy_rows(t, 0, out, 0, t.size(0));
  for (int64_t r = t.size(0); r < n; ++r) copy_rows(t, t.size(0) - 1, out, r, 1);
  return out;
}

// Megatron's grouped QKV rows from separate q [NH·HD], k [KV·HD], v [KV·HD] rows: per KV group g,
// the NH/KV query heads of g, then k_g, then v_g.
Tensor group_qkv(const Tensor& q, const Tensor& k, const Tensor& v, int64_t NH, int64_t KV, int64_t HD) {
  Shape shape = q.shape();
  shape[0] = (NH + 2 * KV) * HD;
  Tensor out = Tensor::empty(shape);
  const int64_t per = NH / KV;
  int64_t at = 0;
  for (int64_t g = 0; g < KV; ++g) {
    copy_rows(q, g * per * HD, out, at, per * HD);
    at += per * HD;
    copy_rows(k, g * HD, out, at, HD);
    at += HD;
    copy_rows(v, g * HD, out, at, HD);
    at += HD;
  }
  return out;
}

// The inverse of group_qkv: {q, k, v}.
std::vector<Tensor> split_qkv(const Tensor& qkv, int64_t NH, int64_t KV, int64_t HD) {
  Shape qs = qkv.shape(), ks = qkv.shape();
  qs[0] = NH * HD;
  ks[0] = KV * HD;
  Tensor q = Tensor::empty(qs), k = Tensor::empty(ks), v = Tensor::empty(ks);
  const int64_t per = NH / KV;
  int64_t at = 0;
  for (int64_t g = 0; g < KV; ++g) {
    copy_rows(qkv, at, q, g * per * HD, per * HD);
    at += per * HD;
    copy_rows(qkv, at, k, g * HD, HD);
    at += HD;
    copy_rows(qkv, at, v, g * HD, HD);
    at += HD;
  }
  return {q, k, v};
}

std::string gale_layer(int64_t i, const char* rest) { return "decoder.layers." + std::to_string(i) + "." + rest; }
std::string llama_layer(int64_t i, const char* rest) { return "model.layers." + std::to_string(i) + "." + rest; }
std::string gpt2_layer(int64_t i, const char* rest) { return "transformer.h." + std::to_string(i) + "." + rest; }

struct Dims {
  int64_t H, NH, KV, HD, F, V, Vp, P;
};
Dims dims(const HfModel& m) {
  const ModelArgs& a = m.model;
  return {a.hidden_size, a.num_attention_heads, a.num_kv_heads, a.kv_channels, a.ffn_hidden_size, m.vocab_size,
          a.padded_vocab_size, a.max_position_embeddings};
}

// One direction's list of outputs, built from a source of inputs; each output is stored in
// `store` as it is put (its f32 intermediate is freed at once).
class Mapper {
 public:
  Mapper(const TensorSource& src, DType store) : src_(src), store_(store) {}
  StatusOr<Tensor> get(const std::string& name, const Shape& shape) { return src_(name, shape); }
  void put(std::string name, Tensor t) {
    if (store_ == DType::kBF16) t = to_bf16(t);
    out_.push_back({std::move(name), std::move(t)});
  }
  std::vector<NamedTensor> take() { return std::move(out_); }

 private:
  static Tensor to_bf16(const Tensor& t) {
    Tensor b = Tensor::empty(t.shape(), DType::kBF16);
    const float* s = t.data<float>();
    bf16* d = b.data<bf16>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] = float_to_bf16(s[i]);
    return b;
  }
  const TensorSource& src_;
  DType store_;
  std::vector<NamedTensor> out_;
};

Status gpt2_to_gale(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor wte, mp.get("transformer.wte.weight", {d.V, d.H}));
  mp.put("embedding.word_embeddings.weight", pad_rows(wte, d.Vp));
  GALE_ASSIGN_OR_RETURN(Tensor wpe, mp.get("transformer.wpe.weight", {d.P, d.H}));
  mp.put("embedding.position_embeddings.weight", wpe);
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    for (auto [hf, gale] : {std::pair{"ln_1", "input_layernorm"}, std::pair{"ln_2", "pre_mlp_layernorm"}})
      for (const char* wb : {".weight", ".bias"}) {
        GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(gpt2_layer(i, (std::string(hf) + wb).c_str()), {d.H}));
        mp.put(gale_layer(i, (std::string(gale) + wb).c_str()), t);
      }
    GALE_ASSIGN_OR_RETURN(Tensor attn_w, mp.get(gpt2_layer(i, "attn.c_attn.weight"), {d.H, 3 * d.H}));
    const Tensor qkv_w = transpose(attn_w);  // [3H, H]: q rows, k rows, v rows
    mp.put(gale_layer(i, "self_attention.linear_qkv.weight"),
           group_qkv(rows(qkv_w, 0, d.H), rows(qkv_w, d.H, d.H), rows(qkv_w, 2 * d.H, d.H), d.NH, d.NH, d.HD));
    GALE_ASSIGN_OR_RETURN(Tensor attn_b, mp.get(gpt2_layer(i, "attn.c_attn.bias"), {3 * d.H}));
    mp.put(gale_layer(i, "self_attention.linear_qkv.bias"),
           group_qkv(rows(attn_b, 0, d.H), rows(attn_b, d.H, d.H), rows(attn_b, 2 * d.H, d.H), d.NH, d.NH, d.HD));
    GALE_ASSIGN_OR_RETURN(Tensor proj_w, mp.get(gpt2_layer(i, "attn.c_proj.weight"), {d.H, d.H}));
    mp.put(gale_layer(i, "self_attention.linear_proj.weight"), transpose(proj_w));
    GALE_ASSIGN_OR_RETURN(Tensor proj_b, mp.get(gpt2_layer(i, "attn.c_proj.bias"), {d.H}));
    mp.put(gale_layer(i, "self_attention.linear_proj.bias"), proj_b);
    GALE_ASSIGN_OR_RETURN(Tensor fc_w, mp.get(gpt2_layer(i, "mlp.c_fc.weight"), {d.H, d.F}));
    mp.put(gale_layer(i, "mlp.linear_fc1.weight"), transpose(fc_w));
    GALE_ASSIGN_OR_RETURN(Tensor fc_b, mp.get(gpt2_layer(i, "mlp.c_fc.bias"), {d.F}));
    mp.put(gale_layer(i, "mlp.linear_fc1.bias"), fc_b);
    GALE_ASSIGN_OR_RETURN(Tensor out_w, mp.get(gpt2_layer(i, "mlp.c_proj.weight"), {d.F, d.H}));
    mp.put(gale_layer(i, "mlp.linear_fc2.weight"), transpose(out_w));
    GALE_ASSIGN_OR_RETURN(Tensor out_b, mp.get(gpt2_layer(i, "mlp.c_proj.bias"), {d.H}));
    mp.put(gale_layer(i, "mlp.linear_fc2.bias"), out_b);
  }
  for (const char* wb : {".weight", ".bias"}) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(std::string("transformer.ln_f") + wb, {d.H}));
    mp.put(std::string("decoder.final_layernorm") + wb, t);
  }
  return Status::Ok();
}

Status gale_to_gpt2(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor wte, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
  mp.put("transformer.wte.weight", rows(wte, 0, d.V));
  GALE_ASSIGN_OR_RETURN(Tensor wpe, mp.get("embedding.position_embeddings.weight", {d.P, d.H}));
  mp.put("transformer.wpe.weight", wpe);
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    for (auto [hf, gale] : {std::pair{"ln_1", "input_layernorm"}, std::pair{"ln_2", "pre_mlp_layernorm"}})
      for (const char* wb : {".weight", ".bias"}) {
        GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(gale_layer(i, (std::string(gale) + wb).c_str()), {d.H}));
        mp.put(gpt2_layer(i, (std::string(hf) + wb).c_str()), t);
      }
    GALE_ASSIGN_OR_RETURN(Tensor qkv_w, mp.get(gale_layer(i, "self_attention.linear_qkv.weight"), {3 * d.H, d.H}));
    mp.put(gpt2_layer(i, "attn.c_attn.weight"), transpose(concat_rows(split_qkv(qkv_w, d.NH, d.NH, d.HD))));
    GALE_ASSIGN_OR_RETURN(Tensor qkv_b, mp.get(gale_layer(i, "self_attention.linear_qkv.bias"), {3 * d.H}));
    mp.put(gpt2_layer(i, "attn.c_attn.bias"), concat_rows(split_qkv(qkv_b, d.NH, d.NH, d.HD)));
    GALE_ASSIGN_OR_RETURN(Tensor proj_w, mp.get(gale_layer(i, "self_attention.linear_proj.weight"), {d.H, d.H}));
    mp.put(gpt2_layer(i, "attn.c_proj.weight"), transpose(proj_w));
    GALE_ASSIGN_OR_RETURN(Tensor proj_b, mp.get(gale_layer(i, "self_attention.linear_proj.bias"), {d.H}));
    mp.put(gpt2_layer(i, "attn.c_proj.bias"), proj_b);
    GALE_ASSIGN_OR_RETURN(Tensor fc1_w, mp.get(gale_layer(i, "mlp.linear_fc1.weight"), {d.F, d.H}));
    mp.put(gpt2_layer(i, "mlp.c_fc.weight"), transpose(fc1_w));
    GALE_ASSIGN_OR_RETURN(Tensor fc1_b, mp.get(gale_layer(i, "mlp.linear_fc1.bias"), {d.F}));
    mp.put(gpt2_layer(i, "mlp.c_fc.bias"), fc1_b);
    GALE_ASSIGN_OR_RETURN(Tensor fc2_w, mp.get(gale_layer(i, "mlp.linear_fc2.weight"), {d.H, d.F}));
    mp.put(gpt2_layer(i, "mlp.c_proj.weight"), transpose(fc2_w));
    GALE_ASSIGN_OR_RETURN(Tensor fc2_b, mp.get(gale_layer(i, "mlp.linear_fc2.bias"), {d.H}));
    mp.put(gpt2_layer(i, "mlp.c_proj.bias"), fc2_b);
  }
  for (const char* wb : {".weight", ".bias"}) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(std::string("decoder.final_layernorm") + wb, {d.H}));
    mp.put(std::string("transformer.ln_f") + wb, t);
  }
  return Status::Ok();
}

// Bloom's fused query_key_value rows are per head: [q_h; k_h; v_h] for h = 0..NH-1 (HF's
// _split_heads views them as [NH, 3, HD]); split into q, k, v rows and back.
// BloomForCausalLM's files name its tensors "transformer.<name>"; the original bigscience/bloom-*
// files were saved from BloomModel and name them "<name>". `prefix` is one of the two.
std::string bloom_layer(const std::string& prefix, int64_t i, const char* rest) {
  return prefix + "h." + std::to_string(i) + "." + rest;
}

std::vector<Tensor> split_bloom_qkv(const Tensor& qkv, int64_t NH, int64_t HD) {
  Shape s = qkv.shape();
  s[0] = NH * HD;
  Tensor q = Tensor::empty(s), k = Tensor::empty(s), v = Tensor::empty(s);
  for (int64_t h = 0; h < NH; ++h) {
    copy_rows(qkv, (3 * h + 0) * HD, q, h * HD, HD);
    copy_rows(qkv, (3 * h + 1) * HD, k, h * HD, HD);
    copy_rows(qkv, (3 * h + 2) * HD, v, h * HD, HD);
  }
  return {q, k, v};
}

Tensor fuse_bloom_qkv(const std::vector<Tensor>& qkv, int64_t NH, int64_t HD) {
  Shape s = qkv[0].shape();
  s[0] = 3 * NH * HD;
  Tensor out = Tensor::empty(s);
  for (int64_t h = 0; h < NH; ++h)
    for (int64_t j = 0; j < 3; ++j) copy_rows(qkv[static_cast<size_t>(j)], h * HD, out, (3 * h + j) * HD, HD);
  return out;
}

// Bloom <-> Gale names: the layer tensors that map one to one ([out, in] in both).
const std::pair<const char*, const char*> kBloomLayerTensors[] = {
    {"input_layernorm.weight", "input_layernorm.weight"},
    {"input_layernorm.bias", "input_layernorm.bias"},
    {"post_attention_layernorm.weight", "pre_mlp_layernorm.weight"},
    {"post_attention_layernorm.bias", "pre_mlp_layernorm.bias"},
    {"self_attention.dense.weight", "self_attention.linear_proj.weight"},
    {"self_attention.dense.bias", "self_attention.linear_proj.bias"},
    {"mlp.dense_h_to_4h.weight", "mlp.linear_fc1.weight"},
    {"mlp.dense_h_to_4h.bias", "mlp.linear_fc1.bias"},
    {"mlp.dense_4h_to_h.weight", "mlp.linear_fc2.weight"},
    {"mlp.dense_4h_to_h.bias", "mlp.linear_fc2.bias"},
};
const std::pair<const char*, const char*> kBloomOuterTensors[] = {
    {"word_embeddings_layernorm.weight", "embedding.norm.weight"},
    {"word_embeddings_layernorm.bias", "embedding.norm.bias"},
    {"ln_f.weight", "decoder.final_layernorm.weight"},
    {"ln_f.bias", "decoder.final_layernorm.bias"},
};

Shape bloom_layer_shape(const Dims& d, const std::string& gale_name) {
  if (gale_name == "self_attention.linear_proj.weight") return {d.H, d.H};
  if (gale_name == "mlp.linear_fc1.weight") return {d.F, d.H};
  if (gale_name == "mlp.linear_fc1.bias") return {d.F};
  if (gale_name == "mlp.linear_fc2.weight") return {d.H, d.F};
  return {d.H};  // norms and the H-sized biases
}

// `to_gale`: Bloom -> Gale, else Gale -> Bloom.
Status map_bloom(const HfModel& m, Mapper& mp, bool to_gale) {
  const Dims d = dims(m);
  auto one = [&](const std::string& hf, const std::string& gale, const Shape& shape) -> Status {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(to_gale ? hf : gale, shape));
    mp.put(to_gale ? gale : hf, t);
    return Status::Ok();
  };
  std::string prefix = "transformer.";  // what Gale writes
  if (to_gale) {
    StatusOr<Tensor> wte = mp.get(prefix + "word_embeddings.weight", {d.V, d.H});
    if (!wte.ok() && wte.status().code() == StatusCode::kNotFound) {
      StatusOr<Tensor> bare = mp.get("word_embeddings.weight", {d.V, d.H});
      if (bare.ok()) prefix.clear(), wte = std::move(bare);
    }
    GALE_RETURN_IF_ERROR(wte.status());
    mp.put("embedding.word_embeddings.weight", pad_rows(wte.value(), d.Vp));
  } else {
    GALE_ASSIGN_OR_RETURN(Tensor wte, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
    mp.put(prefix + "word_embeddings.weight", rows(wte, 0, d.V));
  }
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    for (const auto& [hf, gale] : kBloomLayerTensors)
      GALE_RETURN_IF_ERROR(one(bloom_layer(prefix, i, hf), gale_layer(i, gale), bloom_layer_shape(d, gale)));
    for (const bool weight : {true, false}) {
      const std::string hf = bloom_layer(prefix, i, weight ? "self_attention.query_key_value.weight"
                                                           : "self_attention.query_key_value.bias");
      const std::string gale = gale_layer(i, weight ? "self_attention.linear_qkv.weight" : "self_attention.linear_qkv.bias");
      const Shape shape = weight ? Shape{3 * d.H, d.H} : Shape{3 * d.H};
      GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(to_gale ? hf : gale, shape));
      if (to_gale) {
        const std::vector<Tensor> qkv = split_bloom_qkv(t, d.NH, d.HD);
        mp.put(gale, group_qkv(qkv[0], qkv[1], qkv[2], d.NH, d.NH, d.HD));
      } else {
        mp.put(hf, fuse_bloom_qkv(split_qkv(t, d.NH, d.NH, d.HD), d.NH, d.HD));
      }
    }
  }
  for (const auto& [hf, gale] : kBloomOuterTensors) GALE_RETURN_IF_ERROR(one(prefix + hf, gale, {d.H}));
  return Status::Ok();
}

// Mixtral's layer i MLP: block_sparse_moe.gate [E, H] is the router; expert j's w1 (gate) and w3
// (up) [Fe, H] stack into linear_fc1 = [w1; w3], and w2 [H, Fe] is linear_fc2.
std::string mixtral_expert(int64_t i, int64_t j, const char* w) {
  return llama_layer(i, ("block_sparse_moe.experts." + std::to_string(j) + "." + w + ".weight").c_str());
}
std::string gale_expert(int64_t i, int64_t j, const char* linear) {
  return gale_layer(i, ("mlp.experts.local_experts." + std::to_string(j) + "." + linear + ".weight").c_str());
}

Status mixtral_experts_to_gale(const HfModel& m, int64_t i, Mapper& mp) {
  const int64_t H = m.model.hidden_size, E = m.moe.num_experts, F = m.moe.moe_ffn_hidden_size;
  GALE_ASSIGN_OR_RETURN(Tensor router, mp.get(llama_layer(i, "block_sparse_moe.gate.weight"), {E, H}));
  mp.put(gale_layer(i, "mlp.router.weight"), router);
  for (int64_t j = 0; j < E; ++j) {
    GALE_ASSIGN_OR_RETURN(Tensor w1, mp.get(mixtral_expert(i, j, "w1"), {F, H}));
    GALE_ASSIGN_OR_RETURN(Tensor w3, mp.get(mixtral_expert(i, j, "w3"), {F, H}));
    mp.put(gale_expert(i, j, "linear_fc1"), concat_rows({w1, w3}));
    GALE_ASSIGN_OR_RETURN(Tensor w2, mp.get(mixtral_expert(i, j, "w2"), {H, F}));
    mp.put(gale_expert(i, j, "linear_fc2"), w2);
  }
  return Status::Ok();
}

Status gale_experts_to_mixtral(const HfModel& m, int64_t i, Mapper& mp) {
  const int64_t H = m.model.hidden_size, E = m.moe.num_experts, F = m.moe.moe_ffn_hidden_size;
  GALE_ASSIGN_OR_RETURN(Tensor router, mp.get(gale_layer(i, "mlp.router.weight"), {E, H}));
  mp.put(llama_layer(i, "block_sparse_moe.gate.weight"), router);
  for (int64_t j = 0; j < E; ++j) {
    GALE_ASSIGN_OR_RETURN(Tensor fc1, mp.get(gale_expert(i, j, "linear_fc1"), {2 * F, H}));
    mp.put(mixtral_expert(i, j, "w1"), rows(fc1, 0, F));
    mp.put(mixtral_expert(i, j, "w3"), rows(fc1, F, F));
    GALE_ASSIGN_OR_RETURN(Tensor fc2, mp.get(gale_expert(i, j, "linear_fc2"), {H, F}));
    mp.put(mixtral_expert(i, j, "w2"), fc2);
  }
  return Status::Ok();
}

// A SwiGLU MLP's HF gate_proj, up_proj [F, H] and down_proj [H, F] (`hf` the module prefix, e.g.
// "model.layers.0.mlp.shared_expert.") <-> Gale's linear_fc1 = [gate; up] and linear_fc2 (`gale`
// the prefix, e.g. "decoder.layers.0.mlp.shared_experts.").
Status swiglu_mlp_to_gale(const std::string& hf, const std::string& gale, int64_t F, int64_t H, Mapper& mp) {
  GALE_ASSIGN_OR_RETURN(Tensor gate, mp.get(hf + "gate_proj.weight", {F, H}));
  GALE_ASSIGN_OR_RETURN(Tensor up, mp.get(hf + "up_proj.weight", {F, H}));
  mp.put(gale + "linear_fc1.weight", concat_rows({gate, up}));
  GALE_ASSIGN_OR_RETURN(Tensor down, mp.get(hf + "down_proj.weight", {H, F}));
  mp.put(gale + "linear_fc2.weight", down);
  return Status::Ok();
}
Status gale_to_swiglu_mlp(const std::string& gale, const std::string& hf, int64_t F, int64_t H, Mapper& mp) {
  GALE_ASSIGN_OR_RETURN(Tensor fc1, mp.get(gale + "linear_fc1.weight", {2 * F, H}));
  mp.put(hf + "gate_proj.weight", rows(fc1, 0, F));
  mp.put(hf + "up_proj.weight", rows(fc1, F, F));
  GALE_ASSIGN_OR_RETURN(Tensor fc2, mp.get(gale + "linear_fc2.weight", {H, F}));
  mp.put(hf + "down_proj.weight", fc2);
  return Status::Ok();
}

// Qwen2-MoE's, Qwen3-MoE's and Qwen3-Next's sparse layer i: mlp.gate [E, H] is the router,
// mlp.experts.j.{gate,up,down}_proj the experts; Qwen2-MoE and Qwen3-Next add the shared expert
// mlp.shared_expert.{gate,up,down}_proj and mlp.shared_expert_gate [1, H], its gate_weight.
Status qwen_moe_experts_to_gale(const HfModel& m, int64_t i, Mapper& mp) {
  const int64_t H = m.model.hidden_size, E = m.moe.num_experts, F = m.moe.moe_ffn_hidden_size;
  GALE_ASSIGN_OR_RETURN(Tensor router, mp.get(llama_layer(i, "mlp.gate.weight"), {E, H}));
  mp.put(gale_layer(i, "mlp.router.weight"), router);
  for (int64_t j = 0; j < E; ++j)
    GALE_RETURN_IF_ERROR(swiglu_mlp_to_gale(llama_layer(i, ("mlp.experts." + std::to_string(j) + ".").c_str()),
                                            gale_layer(i, ("mlp.experts.local_experts." + std::to_string(j) + ".").c_str()),
                                            F, H, mp));
  if (m.moe.moe_shared_expert_intermediate_size == kUnset) return Status::Ok();  // Qwen3-MoE
  const int64_t Fs = m.moe.moe_shared_expert_intermediate_size;
  GALE_RETURN_IF_ERROR(swiglu_mlp_to_gale(llama_layer(i, "mlp.shared_expert."), gale_layer(i, "mlp.shared_experts."), Fs, H, mp));
  GALE_ASSIGN_OR_RETURN(Tensor gate, mp.get(llama_layer(i, "mlp.shared_expert_gate.weight"), {1, H}));
  mp.put(gale_layer(i, "mlp.shared_experts.gate_weight"), gate);
  return Status::Ok();
}

Status gale_experts_to_qwen_moe(const HfModel& m, int64_t i, Mapper& mp) {
  const int64_t H = m.model.hidden_size, E = m.moe.num_experts, F = m.moe.moe_ffn_hidden_size;
  GALE_ASSIGN_OR_RETURN(Tensor router, mp.get(gale_layer(i, "mlp.router.weight"), {E, H}));
  mp.put(llama_layer(i, "mlp.gate.weight"), router);
  for (int64_t j = 0; j < E; ++j)
    GALE_RETURN_IF_ERROR(gale_to_swiglu_mlp(gale_layer(i, ("mlp.experts.local_experts." + std::to_string(j) + ".").c_str()),
                                            llama_layer(i, ("mlp.experts." + std::to_string(j) + ".").c_str()), F, H, mp));
  if (m.moe.moe_shared_expert_intermediate_size == kUnset) return Status::Ok();  // Qwen3-MoE
  const int64_t Fs = m.moe.moe_shared_expert_intermediate_size;
  GALE_RETURN_IF_ERROR(gale_to_swiglu_mlp(gale_layer(i, "mlp.shared_experts."), llama_layer(i, "mlp.shared_expert."), Fs, H, mp));
  GALE_ASSIGN_OR_RETURN(Tensor gate, mp.get(gale_layer(i, "mlp.shared_experts.gate_weight"), {1, H}));
  mp.put(llama_layer(i, "mlp.shared_expert_gate.weight"), gate);
  return Status::Ok();
}

// Whether layer i of `m` is a MoE layer.
bool moe_layer(const HfModel& m, int64_t i) {
  return m.moe.enabled() && (m.moe.layer_pattern.empty() || m.moe.layer_pattern.at(static_cast<size_t>(i)) != 0);
}

// DeepSeek-V3's multi-latent attention of layer i: HF's q_a_proj / q_a_layernorm / q_b_proj,
// kv_a_proj_with_mqa / kv_a_layernorm / kv_b_proj and o_proj are Gale's linear_q_down_proj /
// linear_q_up_proj.layer_norm_weight / linear_q_up_proj, linear_kv_down_proj /
// linear_kv_up_proj.layer_norm_weight / linear_kv_up_proj and linear_proj, row for row: both store
// q_b_proj's rows per head [nope; pe], kv_a_proj_with_mqa's as [latent; k_pe] and kv_b_proj's per
// head [k_nope; v], and both rotate q_pe / k_pe in DeepSeek's interleaved layout (rope_interleave).
struct MlaPair {
  const char* hf;
  const char* gale;
  int64_t rows, cols;  // cols 0: a vector
};
std::vector<MlaPair> mla_pairs(const HfModel& m) {
  const ModelArgs& a = m.model;
  const int64_t H = a.hidden_size, NH = a.num_attention_heads, Cq = a.q_lora_rank, Ckv = a.kv_lora_rank;
  const int64_t Dq = a.qk_head_dim + a.qk_pos_emb_head_dim, Dv = a.v_head_dim;
  return {{"self_attn.q_a_proj.weight", "self_attention.linear_q_down_proj.weight", Cq, H},
          {"self_attn.q_a_layernorm.weight", "self_attention.linear_q_up_proj.layer_norm_weight", Cq, 0},
          {"self_attn.q_b_proj.weight", "self_attention.linear_q_up_proj.weight", NH * Dq, Cq},
          {"self_attn.kv_a_proj_with_mqa.weight", "self_attention.linear_kv_down_proj.weight",
           Ckv + a.qk_pos_emb_head_dim, H},
          {"self_attn.kv_a_layernorm.weight", "self_attention.linear_kv_up_proj.layer_norm_weight", Ckv, 0},
          {"self_attn.kv_b_proj.weight", "self_attention.linear_kv_up_proj.weight", NH * (a.qk_head_dim + Dv), Ckv},
          {"self_attn.o_proj.weight", "self_attention.linear_proj.weight", H, NH * Dv}};
}

// Which way a conversion copies: HF -> Gale (import) or Gale -> HF (export).
enum class Direction { kToGale, kToHf };

// One tensor between its HF name and its Gale name, in `dir`.
Status copy_tensor(Direction dir, const std::string& hf, const std::string& gale, const Shape& shape, Mapper& mp) {
  const bool to_gale = dir == Direction::kToGale;
  GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(to_gale ? hf : gale, shape));
  mp.put(to_gale ? gale : hf, t);
  return Status::Ok();
}

Status copy_swiglu_mlp(Direction dir, const std::string& hf, const std::string& gale, int64_t F, int64_t H,
                       Mapper& mp) {
  return dir == Direction::kToGale ? swiglu_mlp_to_gale(hf, gale, F, H, mp) : gale_to_swiglu_mlp(gale, hf, F, H, mp);
}

// One DeepSeek-V3 decoder layer: HF's tensors under `hf` (e.g. "model.layers.3.") <-> Gale's under
// `gale` ("decoder.layers.3." or "mtp.layers.0.transformer_layer."). A MoE layer's mlp.gate.weight
// [E, H] is the router, mlp.gate.e_score_correction_bias [E] its expert_bias, mlp.experts.j and
// mlp.shared_experts the SwiGLU experts and shared expert; a dense layer has LLaMA's MLP.
Status copy_deepseek_v3_layer(Direction dir, const HfModel& m, const std::string& hf, const std::string& gale,
                              bool moe, Mapper& mp) {
  const Dims d = dims(m);
  const int64_t E = m.moe.num_experts, Fe = m.moe.moe_ffn_hidden_size, Fs = m.moe.moe_shared_expert_intermediate_size;
  GALE_RETURN_IF_ERROR(copy_tensor(dir, hf + "input_layernorm.weight", gale + "input_layernorm.weight", {d.H}, mp));
  for (const MlaPair& p : mla_pairs(m))
    GALE_RETURN_IF_ERROR(
        copy_tensor(dir, hf + p.hf, gale + p.gale, p.cols ? Shape{p.rows, p.cols} : Shape{p.rows}, mp));
  if (hf_is_deepseek_v32(m.model))  // DeepSeek-V3.2's lightning indexer, row for row (train/hf_deepseek_v32.h)
    for (const IndexerPair& p : deepseek_v32_indexer_pairs(m.model))
      GALE_RETURN_IF_ERROR(copy_tensor(dir, hf + p.hf, gale + p.gale, p.shape, mp));
  GALE_RETURN_IF_ERROR(
      copy_tensor(dir, hf + "post_attention_layernorm.weight", gale + "pre_mlp_layernorm.weight", {d.H}, mp));
  if (!moe) return copy_swiglu_mlp(dir, hf + "mlp.", gale + "mlp.", d.F, d.H, mp);
  GALE_RETURN_IF_ERROR(copy_tensor(dir, hf + "mlp.gate.weight", gale + "mlp.router.weight", {E, d.H}, mp));
  GALE_RETURN_IF_ERROR(
      copy_tensor(dir, hf + "mlp.gate.e_score_correction_bias", gale + "mlp.router.expert_bias", {E}, mp));
  for (int64_t j = 0; j < E; ++j)
    GALE_RETURN_IF_ERROR(copy_swiglu_mlp(dir, hf + "mlp.experts." + std::to_string(j) + ".",
                                         gale + "mlp.experts.local_experts." + std::to_string(j) + ".", Fe, d.H, mp));
  return copy_swiglu_mlp(dir, hf + "mlp.shared_experts.", gale + "mlp.shared_experts.", Fs, d.H, mp);
}

std::string hf_layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }
std::string gale_mtp_prefix(int64_t k) { return "mtp.layers." + std::to_string(k) + "."; }

// DeepSeek-V3's multi-token-prediction layer k, stored as HF layer L + k: enorm, hnorm, eh_proj
// [H, 2H] (its input [enorm(embedding) | hnorm(h)], Megatron's order too, so copied as is) and
// shared_head.norm are mtp.layers.k.{enorm, hnorm, eh_proj, final_layernorm}; the decoder layer's
// tensors are mtp.layers.k.transformer_layer.* (a MoE layer: the last decoder layer is one). Its
// embed_tokens and shared_head.head are copies of the main embedding and lm_head: Gale's MTP
// layers share those (hf_mtp_shared_copies).
const char* const kMtpNorms[][2] = {{"enorm.weight", "enorm.weight"},
                                    {"hnorm.weight", "hnorm.weight"},
                                    {"shared_head.norm.weight", "final_layernorm.weight"}};

// MTP layer k: DeepSeek-V3's decoder layer num_layers + k (its enorm, hnorm, eh_proj, shared_head.norm
// and a full MoE layer) <-> Gale's mtp.layers.k.
Status copy_mtp_layer(Direction dir, const HfModel& m, int64_t k, Mapper& mp) {
  const Dims d = dims(m);
  const std::string hf = hf_layer_prefix(m.model.num_layers + k), gale = gale_mtp_prefix(k);
  for (const auto& [h, g] : kMtpNorms) GALE_RETURN_IF_ERROR(copy_tensor(dir, hf + h, gale + g, {d.H}, mp));
  GALE_RETURN_IF_ERROR(copy_tensor(dir, hf + "eh_proj.weight", gale + "eh_proj.weight", {d.H, 2 * d.H}, mp));
  return copy_deepseek_v3_layer(dir, m, hf, gale + "transformer_layer.", true, mp);
}

// The LLaMA-family tail both ways: model.norm <-> decoder.final_layernorm, and an untied lm_head <->
// output_layer (padded to Vp rows in Gale).
Status final_norm_and_head_to_gale(const HfModel& m, const Dims& d, Mapper& mp) {
  GALE_ASSIGN_OR_RETURN(Tensor norm, mp.get("model.norm.weight", {d.H}));
  mp.put("decoder.final_layernorm.weight", norm);
  if (m.model.untie_embeddings_and_output_weights) {
    GALE_ASSIGN_OR_RETURN(Tensor head, mp.get("lm_head.weight", {d.V, d.H}));
    mp.put("output_layer.weight", pad_rows(head, d.Vp));
  }
  return Status::Ok();
}

Status final_norm_and_head_to_hf(const HfModel& m, const Dims& d, Mapper& mp) {
  GALE_ASSIGN_OR_RETURN(Tensor norm, mp.get("decoder.final_layernorm.weight", {d.H}));
  mp.put("model.norm.weight", norm);
  if (m.model.untie_embeddings_and_output_weights) {
    GALE_ASSIGN_OR_RETURN(Tensor head, mp.get("output_layer.weight", {d.Vp, d.H}));
    mp.put("lm_head.weight", rows(head, 0, d.V));
  }
  return Status::Ok();
}

Status deepseek_v3_to_gale(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("model.embed_tokens.weight", {d.V, d.H}));
  mp.put("embedding.word_embeddings.weight", pad_rows(emb, d.Vp));
  for (int64_t i = 0; i < m.model.num_layers; ++i)
    GALE_RETURN_IF_ERROR(
        copy_deepseek_v3_layer(Direction::kToGale, m, hf_layer_prefix(i), gale_layer(i, ""), moe_layer(m, i), mp));
  GALE_RETURN_IF_ERROR(final_norm_and_head_to_gale(m, d, mp));
  for (int64_t k = 0; k < m.mtp_layers; ++k) {
    GALE_RETURN_IF_ERROR(copy_mtp_layer(Direction::kToGale, m, k, mp));
  }
  return Status::Ok();
}

Status gale_to_deepseek_v3(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
  mp.put("model.embed_tokens.weight", rows(emb, 0, d.V));
  for (int64_t i = 0; i < m.model.num_layers; ++i)
    GALE_RETURN_IF_ERROR(
        copy_deepseek_v3_layer(Direction::kToHf, m, hf_layer_prefix(i), gale_layer(i, ""), moe_layer(m, i), mp));
  GALE_RETURN_IF_ERROR(final_norm_and_head_to_hf(m, d, mp));
  const char* head_name = m.model.untie_embeddings_and_output_weights ? "output_layer.weight"
                                                                       : "embedding.word_embeddings.weight";
  for (int64_t k = 0; k < m.mtp_layers; ++k) {
    GALE_RETURN_IF_ERROR(copy_mtp_layer(Direction::kToHf, m, k, mp));
    const std::string hf = hf_layer_prefix(m.model.num_layers + k);
    // DeepSeek-V3's files repeat the shared embedding and output layer in every MTP layer.
    GALE_ASSIGN_OR_RETURN(Tensor e, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
    mp.put(hf + "embed_tokens.weight", rows(e, 0, d.V));
    GALE_ASSIGN_OR_RETURN(Tensor head, mp.get(head_name, {d.Vp, d.H}));
    mp.put(hf + "shared_head.head.weight", rows(head, 0, d.V));
  }
  return Status::Ok();
}

// Qwen3-Next's Gated DeltaNet layer i (linear_attn.*) as Megatron's GDN mixer. HF's in_proj_qkvz
// holds per key head g the rows [q_g (DK) | k_g (DK) | v_g (r·DV) | z_g (r·DV)] (r = NV / NK, the
// value heads g·r .. g·r + r − 1) and in_proj_ba per key head [b_g (r) | a_g (r)]; Megatron's
// in_proj is [q | k | v | z | b | a], each section in head order. conv1d [C, 1, K] (channels
// [q | k | v] in head order on both sides) drops its unit dimension; the gated norm's weight is a
// plain scale in HF and stored zero-centred (--apply-layernorm-1p) in Gale: w − 1.
Status qwen3_next_gdn_to_gale(const HfModel& m, int64_t i, Mapper& mp) {
  const ModelArgs& a = m.model;
  const int64_t H = a.hidden_size, NK = a.linear_num_key_heads, NV = a.linear_num_value_heads;
  const int64_t DK = a.linear_key_head_dim, DV = a.linear_value_head_dim, K = a.linear_conv_kernel_dim;
  const int64_t r = NV / NK, per_group = 2 * DK + 2 * r * DV, C = 2 * NK * DK + NV * DV;
  GALE_ASSIGN_OR_RETURN(Tensor norm, mp.get(llama_layer(i, "input_layernorm.weight"), {H}));
  mp.put(gale_layer(i, "self_attention.in_proj.layer_norm_weight"), norm);
  GALE_ASSIGN_OR_RETURN(Tensor qkvz, mp.get(llama_layer(i, "linear_attn.in_proj_qkvz.weight"), {NK * per_group, H}));
  GALE_ASSIGN_OR_RETURN(Tensor ba, mp.get(llama_layer(i, "linear_attn.in_proj_ba.weight"), {2 * NV, H}));
  Tensor in_proj = Tensor::empty({2 * NK * DK + 2 * NV * DV + 2 * NV, H});
  const int64_t q_at = 0, k_at = NK * DK, v_at = 2 * NK * DK, z_at = v_at + NV * DV, b_at = z_at + NV * DV,
                a_at = b_at + NV;
  for (int64_t g = 0; g < NK; ++g) {
    const int64_t src = g * per_group;
    copy_rows(qkvz, src, in_proj, q_at + g * DK, DK);
    copy_rows(qkvz, src + DK, in_proj, k_at + g * DK, DK);
    copy_rows(qkvz, src + 2 * DK, in_proj, v_at + g * r * DV, r * DV);
    copy_rows(qkvz, src + 2 * DK + r * DV, in_proj, z_at + g * r * DV, r * DV);
    copy_rows(ba, g * 2 * r, in_proj, b_at + g * r, r);
    copy_rows(ba, g * 2 * r + r, in_proj, a_at + g * r, r);
  }
  mp.put(gale_layer(i, "self_attention.in_proj.weight"), in_proj);
  GALE_ASSIGN_OR_RETURN(Tensor conv, mp.get(llama_layer(i, "linear_attn.conv1d.weight"), {C, 1, K}));
  Tensor conv2 = Tensor::empty({C, K});
  std::memcpy(conv2.data<float>(), conv.data<float>(), static_cast<size_t>(C * K) * sizeof(float));
  mp.put(gale_layer(i, "self_attention.conv1d.weight"), conv2);
  for (const char* name : {"dt_bias", "A_log"}) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(llama_layer(i, (std::string("linear_attn.") + name).c_str()), {NV}));
    mp.put(gale_layer(i, (std::string("self_attention.") + name).c_str()), t);
  }
  GALE_ASSIGN_OR_RETURN(Tensor out_norm, mp.get(llama_layer(i, "linear_attn.norm.weight"), {DV}));
  for (int64_t j = 0; j < DV; ++j) out_norm.data<float>()[j] -= 1.0f;
  mp.put(gale_layer(i, "self_attention.out_norm.weight"), out_norm);
  GALE_ASSIGN_OR_RETURN(Tensor out_proj, mp.get(llama_layer(i, "linear_attn.out_proj.weight"), {H, NV * DV}));
  mp.put(gale_layer(i, "self_attention.out_proj.weight"), out_proj);
  return Status::Ok();
}

// Gale's names of a Qwen3-Next layer's two norms: with GDN layers (a hybrid stack, Megatron's TE spec)
// the attention's input norm is fused into linear_qkv and a dense layer's MLP norm into linear_fc1;
// without them (gated attention alone, Gale's GPT layer) they are input_layernorm / pre_mlp_layernorm.
const char* qwen3_next_attention_norm(const HfModel& m) {
  return m.model.linear_attention_pattern.empty() ? "input_layernorm.weight"
                                                  : "self_attention.linear_qkv.layer_norm_weight";
}
const char* qwen3_next_mlp_norm(const HfModel& m, bool moe) {
  return moe || m.model.linear_attention_pattern.empty() ? "pre_mlp_layernorm.weight"
                                                         : "mlp.linear_fc1.layer_norm_weight";
}

// Qwen3-Next's gated full-attention layer i: q_proj [NH·2·HD, H] holds per head [query_h | gate_h];
// Megatron's --attention-output-gate linear_qkv holds per query group [q heads | gate heads | k | v].
// The norms (input_layernorm, q_norm, k_norm) are zero-centred on both sides: copied.
Status qwen3_next_attention_to_gale(const HfModel& m, int64_t i, Mapper& mp) {
  const Dims d = dims(m);
  const int64_t per = d.NH / d.KV;
  GALE_ASSIGN_OR_RETURN(Tensor norm, mp.get(llama_layer(i, "input_layernorm.weight"), {d.H}));
  mp.put(gale_layer(i, qwen3_next_attention_norm(m)), norm);
  GALE_ASSIGN_OR_RETURN(Tensor qg, mp.get(llama_layer(i, "self_attn.q_proj.weight"), {2 * d.NH * d.HD, d.H}));
  GALE_ASSIGN_OR_RETURN(Tensor k, mp.get(llama_layer(i, "self_attn.k_proj.weight"), {d.KV * d.HD, d.H}));
  GALE_ASSIGN_OR_RETURN(Tensor v, mp.get(llama_layer(i, "self_attn.v_proj.weight"), {d.KV * d.HD, d.H}));
  Tensor qkv = Tensor::empty({(2 * d.NH + 2 * d.KV) * d.HD, d.H});
  int64_t at = 0;
  for (int64_t g = 0; g < d.KV; ++g) {
    for (int64_t part = 0; part < 2; ++part)  // the group's query rows, then its gate rows
      for (int64_t h = g * per; h < (g + 1) * per; ++h, at += d.HD) copy_rows(qg, (2 * h + part) * d.HD, qkv, at, d.HD);
    copy_rows(k, g * d.HD, qkv, at, d.HD);
    at += d.HD;
    copy_rows(v, g * d.HD, qkv, at, d.HD);
    at += d.HD;
  }
  mp.put(gale_layer(i, "self_attention.linear_qkv.weight"), qkv);
  for (auto [hf, gale] : {std::pair{"self_attn.q_norm.weight", "self_attention.q_layernorm.weight"},
                          std::pair{"self_attn.k_norm.weight", "self_attention.k_layernorm.weight"}}) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(llama_layer(i, hf), {d.HD}));
    mp.put(gale_layer(i, gale), t);
  }
  GALE_ASSIGN_OR_RETURN(Tensor o, mp.get(llama_layer(i, "self_attn.o_proj.weight"), {d.H, d.NH * d.HD}));
  mp.put(gale_layer(i, "self_attention.linear_proj.weight"), o);
  return Status::Ok();
}

// Whether Qwen3-Next layer i is a Gated DeltaNet layer: --linear-attention-freq's 1s; a model without
// GDN (--attention-output-gate alone) has gated attention in every layer.
bool qwen3_next_gdn_layer(const HfModel& m, int64_t i) {
  const std::vector<int>& p = m.model.linear_attention_pattern;
  return !p.empty() && p.at(static_cast<size_t>(i)) != 0;
}

// Qwen3NextForCausalLM -> Gale: GDN or gated attention per --linear-attention-freq's
// pattern, then the MLP (a MoE layer's norm is pre_mlp_layernorm, a dense layer's is fused into
// linear_fc1 as Megatron's TE spec names it); every RMSNorm weight is zero-centred on both sides.
Status qwen3_next_to_gale(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("model.embed_tokens.weight", {d.V, d.H}));
  mp.put("embedding.word_embeddings.weight", pad_rows(emb, d.Vp));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(qwen3_next_gdn_layer(m, i)
                             ? qwen3_next_gdn_to_gale(m, i, mp)
                             : qwen3_next_attention_to_gale(m, i, mp));
    const bool moe = moe_layer(m, i);
    GALE_ASSIGN_OR_RETURN(Tensor n2, mp.get(llama_layer(i, "post_attention_layernorm.weight"), {d.H}));
    mp.put(gale_layer(i, qwen3_next_mlp_norm(m, moe)), n2);
    GALE_RETURN_IF_ERROR(moe ? qwen_moe_experts_to_gale(m, i, mp)
                             : swiglu_mlp_to_gale(llama_layer(i, "mlp."), gale_layer(i, "mlp."), d.F, d.H, mp));
  }
  GALE_RETURN_IF_ERROR(final_norm_and_head_to_gale(m, d, mp));
  return Status::Ok();
}

// The inverse of qwen3_next_gdn_to_gale: Megatron's in_proj sections [q | k | v | z | b | a] regrouped
// per key head into in_proj_qkvz and in_proj_ba, conv1d given back its unit dimension, the gated
// norm's zero-centred weight w stored as HF's plain scale w + 1.
Status gale_to_qwen3_next_gdn(const HfModel& m, int64_t i, Mapper& mp) {
  const ModelArgs& a = m.model;
  const int64_t H = a.hidden_size, NK = a.linear_num_key_heads, NV = a.linear_num_value_heads;
  const int64_t DK = a.linear_key_head_dim, DV = a.linear_value_head_dim, K = a.linear_conv_kernel_dim;
  const int64_t r = NV / NK, per_group = 2 * DK + 2 * r * DV, C = 2 * NK * DK + NV * DV;
  GALE_ASSIGN_OR_RETURN(Tensor norm, mp.get(gale_layer(i, "self_attention.in_proj.layer_norm_weight"), {H}));
  mp.put(llama_layer(i, "input_layernorm.weight"), norm);
  GALE_ASSIGN_OR_RETURN(Tensor in_proj,
                        mp.get(gale_layer(i, "self_attention.in_proj.weight"), {2 * NK * DK + 2 * NV * DV + 2 * NV, H}));
  Tensor qkvz = Tensor::empty({NK * per_group, H}), ba = Tensor::empty({2 * NV, H});
  const int64_t q_at = 0, k_at = NK * DK, v_at = 2 * NK * DK, z_at = v_at + NV * DV, b_at = z_at + NV * DV,
                a_at = b_at + NV;
  for (int64_t g = 0; g < NK; ++g) {
    const int64_t dst = g * per_group;
    copy_rows(in_proj, q_at + g * DK, qkvz, dst, DK);
    copy_rows(in_proj, k_at + g * DK, qkvz, dst + DK, DK);
    copy_rows(in_proj, v_at + g * r * DV, qkvz, dst + 2 * DK, r * DV);
    copy_rows(in_proj, z_at + g * r * DV, qkvz, dst + 2 * DK + r * DV, r * DV);
    copy_rows(in_proj, b_at + g * r, ba, g * 2 * r, r);
    copy_rows(in_proj, a_at + g * r, ba, g * 2 * r + r, r);
  }
  mp.put(llama_layer(i, "linear_attn.in_proj_qkvz.weight"), qkvz);
  mp.put(llama_layer(i, "linear_attn.in_proj_ba.weight"), ba);
  GALE_ASSIGN_OR_RETURN(Tensor conv, mp.get(gale_layer(i, "self_attention.conv1d.weight"), {C, K}));
  Tensor conv3 = Tensor::empty({C, 1, K});
  std::memcpy(conv3.data<float>(), conv.data<float>(), static_cast<size_t>(C * K) * sizeof(float));
  mp.put(llama_layer(i, "linear_attn.conv1d.weight"), conv3);
  for (const char* name : {"dt_bias", "A_log"}) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(gale_layer(i, (std::string("self_attention.") + name).c_str()), {NV}));
    mp.put(llama_layer(i, (std::string("linear_attn.") + name).c_str()), t);
  }
  GALE_ASSIGN_OR_RETURN(Tensor out_norm, mp.get(gale_layer(i, "self_attention.out_norm.weight"), {DV}));
  for (int64_t j = 0; j < DV; ++j) out_norm.data<float>()[j] += 1.0f;
  mp.put(llama_layer(i, "linear_attn.norm.weight"), out_norm);
  GALE_ASSIGN_OR_RETURN(Tensor out_proj, mp.get(gale_layer(i, "self_attention.out_proj.weight"), {H, NV * DV}));
  mp.put(llama_layer(i, "linear_attn.out_proj.weight"), out_proj);
  return Status::Ok();
}

// The inverse of qwen3_next_attention_to_gale: each query group's [q heads | gate heads | k | v]
// rows back to q_proj's per-head [query_h | gate_h], k_proj and v_proj.
Status gale_to_qwen3_next_attention(const HfModel& m, int64_t i, Mapper& mp) {
  const Dims d = dims(m);
  const int64_t per = d.NH / d.KV;
  GALE_ASSIGN_OR_RETURN(Tensor norm, mp.get(gale_layer(i, qwen3_next_attention_norm(m)), {d.H}));
  mp.put(llama_layer(i, "input_layernorm.weight"), norm);
  GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(gale_layer(i, "self_attention.linear_qkv.weight"),
                                           {(2 * d.NH + 2 * d.KV) * d.HD, d.H}));
  Tensor qg = Tensor::empty({2 * d.NH * d.HD, d.H}), k = Tensor::empty({d.KV * d.HD, d.H}),
         v = Tensor::empty({d.KV * d.HD, d.H});
  int64_t at = 0;
  for (int64_t g = 0; g < d.KV; ++g) {
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t h = g * per; h < (g + 1) * per; ++h, at += d.HD) copy_rows(qkv, at, qg, (2 * h + part) * d.HD, d.HD);
    copy_rows(qkv, at, k, g * d.HD, d.HD);
    at += d.HD;
    copy_rows(qkv, at, v, g * d.HD, d.HD);
    at += d.HD;
  }
  mp.put(llama_layer(i, "self_attn.q_proj.weight"), qg);
  mp.put(llama_layer(i, "self_attn.k_proj.weight"), k);
  mp.put(llama_layer(i, "self_attn.v_proj.weight"), v);
  for (auto [hf, gale] : {std::pair{"self_attn.q_norm.weight", "self_attention.q_layernorm.weight"},
                          std::pair{"self_attn.k_norm.weight", "self_attention.k_layernorm.weight"}}) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(gale_layer(i, gale), {d.HD}));
    mp.put(llama_layer(i, hf), t);
  }
  GALE_ASSIGN_OR_RETURN(Tensor o, mp.get(gale_layer(i, "self_attention.linear_proj.weight"), {d.H, d.NH * d.HD}));
  mp.put(llama_layer(i, "self_attn.o_proj.weight"), o);
  return Status::Ok();
}

// Gale -> Qwen3NextForCausalLM: the inverse of qwen3_next_to_gale.
Status gale_to_qwen3_next(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
  mp.put("model.embed_tokens.weight", rows(emb, 0, d.V));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(qwen3_next_gdn_layer(m, i)
                             ? gale_to_qwen3_next_gdn(m, i, mp)
                             : gale_to_qwen3_next_attention(m, i, mp));
    const bool moe = moe_layer(m, i);
    GALE_ASSIGN_OR_RETURN(Tensor n2, mp.get(gale_layer(i, qwen3_next_mlp_norm(m, moe)), {d.H}));
    mp.put(llama_layer(i, "post_attention_layernorm.weight"), n2);
    GALE_RETURN_IF_ERROR(moe ? gale_experts_to_qwen_moe(m, i, mp)
                             : gale_to_swiglu_mlp(gale_layer(i, "mlp."), llama_layer(i, "mlp."), d.F, d.H, mp));
  }
  GALE_RETURN_IF_ERROR(final_norm_and_head_to_hf(m, d, mp));
  return Status::Ok();
}

// gpt-oss (GptOssForCausalLM) layer i. Attention as LLaMA's with biases on q/k/v (grouped as the
// weights) and o_proj, and self_attn.sinks [NH] -> self_attention.core_attention.softmax_offset. The
// MLP: mlp.router.{weight [E, H], bias [E]} -> mlp.router.{weight, bias}; the experts are stored fused
// and transposed relative to nn.Linear (x @ W + b): experts.gate_up_proj [E, H, 2F] with gate in the
// even columns and up in the odd ones, gate_up_proj_bias [E, 2F] likewise, down_proj [E, F, H],
// down_proj_bias [E, H]. Expert j's linear_fc1 is [gate; up] [2F, H] (Megatron's GLU halves),
// linear_fc2 [H, F].
void gpt_oss_fc1_from_gate_up(const float* gu, const float* gu_bias, int64_t H, int64_t F, float* fc1, float* fc1_b) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t f = 0; f < F; ++f) {
      fc1[f * H + h] = gu[h * 2 * F + 2 * f];
      fc1[(F + f) * H + h] = gu[h * 2 * F + 2 * f + 1];
    }
  for (int64_t f = 0; f < F; ++f) {
    fc1_b[f] = gu_bias[2 * f];
    fc1_b[F + f] = gu_bias[2 * f + 1];
  }
}
void gpt_oss_gate_up_from_fc1(const float* fc1, const float* fc1_b, int64_t H, int64_t F, float* gu, float* gu_bias) {
  for (int64_t h = 0; h < H; ++h)
    for (int64_t f = 0; f < F; ++f) {
      gu[h * 2 * F + 2 * f] = fc1[f * H + h];
      gu[h * 2 * F + 2 * f + 1] = fc1[(F + f) * H + h];
    }
  for (int64_t f = 0; f < F; ++f) {
    gu_bias[2 * f] = fc1_b[f];
    gu_bias[2 * f + 1] = fc1_b[F + f];
  }
}
// out [C, R] = in [R, C] transposed.
void transpose_into(const float* in, int64_t R, int64_t C, float* out) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) out[c * R + r] = in[r * C + c];
}
std::string gale_expert_bias(int64_t i, int64_t j, const char* linear) {
  return gale_layer(i, ("mlp.experts.local_experts." + std::to_string(j) + "." + linear + ".bias").c_str());
}

Status gpt_oss_attention_to_gale(const HfModel& m, int64_t i, Mapper& mp) {
  const Dims d = dims(m);
  for (const char* wb : {"weight", "bias"}) {
    const bool w = wb[0] == 'w';
    auto shape = [&](int64_t rows) { return w ? Shape{rows, d.H} : Shape{rows}; };
    GALE_ASSIGN_OR_RETURN(Tensor q, mp.get(llama_layer(i, (std::string("self_attn.q_proj.") + wb).c_str()), shape(d.NH * d.HD)));
    GALE_ASSIGN_OR_RETURN(Tensor k, mp.get(llama_layer(i, (std::string("self_attn.k_proj.") + wb).c_str()), shape(d.KV * d.HD)));
    GALE_ASSIGN_OR_RETURN(Tensor v, mp.get(llama_layer(i, (std::string("self_attn.v_proj.") + wb).c_str()), shape(d.KV * d.HD)));
    mp.put(gale_layer(i, (std::string("self_attention.linear_qkv.") + wb).c_str()), group_qkv(q, k, v, d.NH, d.KV, d.HD));
  }
  GALE_ASSIGN_OR_RETURN(Tensor o, mp.get(llama_layer(i, "self_attn.o_proj.weight"), {d.H, d.NH * d.HD}));
  mp.put(gale_layer(i, "self_attention.linear_proj.weight"), o);
  GALE_ASSIGN_OR_RETURN(Tensor ob, mp.get(llama_layer(i, "self_attn.o_proj.bias"), {d.H}));
  mp.put(gale_layer(i, "self_attention.linear_proj.bias"), ob);
  GALE_ASSIGN_OR_RETURN(Tensor sinks, mp.get(llama_layer(i, "self_attn.sinks"), {d.NH}));
  mp.put(gale_layer(i, "self_attention.core_attention.softmax_offset"), sinks);
  return Status::Ok();
}

Status gale_to_gpt_oss_attention(const HfModel& m, int64_t i, Mapper& mp) {
  const Dims d = dims(m);
  const int64_t qkv_rows = (d.NH + 2 * d.KV) * d.HD;
  for (const char* wb : {"weight", "bias"}) {
    const bool w = wb[0] == 'w';
    GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(gale_layer(i, (std::string("self_attention.linear_qkv.") + wb).c_str()),
                                             w ? Shape{qkv_rows, d.H} : Shape{qkv_rows}));
    std::vector<Tensor> parts = split_qkv(qkv, d.NH, d.KV, d.HD);
    const char* names[] = {"self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj."};
    for (int p = 0; p < 3; ++p) mp.put(llama_layer(i, (std::string(names[p]) + wb).c_str()), parts[static_cast<size_t>(p)]);
  }
  GALE_ASSIGN_OR_RETURN(Tensor o, mp.get(gale_layer(i, "self_attention.linear_proj.weight"), {d.H, d.NH * d.HD}));
  mp.put(llama_layer(i, "self_attn.o_proj.weight"), o);
  GALE_ASSIGN_OR_RETURN(Tensor ob, mp.get(gale_layer(i, "self_attention.linear_proj.bias"), {d.H}));
  mp.put(llama_layer(i, "self_attn.o_proj.bias"), ob);
  GALE_ASSIGN_OR_RETURN(Tensor sinks, mp.get(gale_layer(i, "self_attention.core_attention.softmax_offset"), {d.NH}));
  mp.put(llama_layer(i, "self_attn.sinks"), sinks);
  return Status::Ok();
}

Status gpt_oss_experts_to_gale(const HfModel& m, int64_t i, Mapper& mp) {
  const int64_t H = m.model.hidden_size, E = m.moe.num_experts, F = m.moe.moe_ffn_hidden_size;
  GALE_ASSIGN_OR_RETURN(Tensor router, mp.get(llama_layer(i, "mlp.router.weight"), {E, H}));
  mp.put(gale_layer(i, "mlp.router.weight"), router);
  GALE_ASSIGN_OR_RETURN(Tensor router_b, mp.get(llama_layer(i, "mlp.router.bias"), {E}));
  mp.put(gale_layer(i, "mlp.router.bias"), router_b);
  GALE_ASSIGN_OR_RETURN(Tensor gu, mp.get(llama_layer(i, "mlp.experts.gate_up_proj"), {E, H, 2 * F}));
  GALE_ASSIGN_OR_RETURN(Tensor gu_b, mp.get(llama_layer(i, "mlp.experts.gate_up_proj_bias"), {E, 2 * F}));
  GALE_ASSIGN_OR_RETURN(Tensor down, mp.get(llama_layer(i, "mlp.experts.down_proj"), {E, F, H}));
  GALE_ASSIGN_OR_RETURN(Tensor down_b, mp.get(llama_layer(i, "mlp.experts.down_proj_bias"), {E, H}));
  for (int64_t j = 0; j < E; ++j) {
    Tensor fc1 = Tensor::empty({2 * F, H}), fc1_b = Tensor::empty({2 * F});
    gpt_oss_fc1_from_gate_up(gu.data<float>() + j * H * 2 * F, gu_b.data<float>() + j * 2 * F, H, F,
                             fc1.data<float>(), fc1_b.data<float>());
    mp.put(gale_expert(i, j, "linear_fc1"), fc1);
    mp.put(gale_expert_bias(i, j, "linear_fc1"), fc1_b);
    Tensor fc2 = Tensor::empty({H, F}), fc2_b = Tensor::empty({H});
    transpose_into(down.data<float>() + j * F * H, F, H, fc2.data<float>());
    std::memcpy(fc2_b.data<float>(), down_b.data<float>() + j * H, static_cast<size_t>(H) * sizeof(float));
    mp.put(gale_expert(i, j, "linear_fc2"), fc2);
    mp.put(gale_expert_bias(i, j, "linear_fc2"), fc2_b);
  }
  return Status::Ok();
}

Status gale_experts_to_gpt_oss(const HfModel& m, int64_t i, Mapper& mp) {
  const int64_t H = m.model.hidden_size, E = m.moe.num_experts, F = m.moe.moe_ffn_hidden_size;
  GALE_ASSIGN_OR_RETURN(Tensor router, mp.get(gale_layer(i, "mlp.router.weight"), {E, H}));
  mp.put(llama_layer(i, "mlp.router.weight"), router);
  GALE_ASSIGN_OR_RETURN(Tensor router_b, mp.get(gale_layer(i, "mlp.router.bias"), {E}));
  mp.put(llama_layer(i, "mlp.router.bias"), router_b);
  Tensor gu = Tensor::empty({E, H, 2 * F}), gu_b = Tensor::empty({E, 2 * F});
  Tensor down = Tensor::empty({E, F, H}), down_b = Tensor::empty({E, H});
  for (int64_t j = 0; j < E; ++j) {
    GALE_ASSIGN_OR_RETURN(Tensor fc1, mp.get(gale_expert(i, j, "linear_fc1"), {2 * F, H}));
    GALE_ASSIGN_OR_RETURN(Tensor fc1_b, mp.get(gale_expert_bias(i, j, "linear_fc1"), {2 * F}));
    gpt_oss_gate_up_from_fc1(fc1.data<float>(), fc1_b.data<float>(), H, F, gu.data<float>() + j * H * 2 * F,
                             gu_b.data<float>() + j * 2 * F);
    GALE_ASSIGN_OR_RETURN(Tensor fc2, mp.get(gale_expert(i, j, "linear_fc2"), {H, F}));
    GALE_ASSIGN_OR_RETURN(Tensor fc2_b, mp.get(gale_expert_bias(i, j, "linear_fc2"), {H}));
    transpose_into(fc2.data<float>(), H, F, down.data<float>() + j * F * H);
    std::memcpy(down_b.data<float>() + j * H, fc2_b.data<float>(), static_cast<size_t>(H) * sizeof(float));
  }
  mp.put(llama_layer(i, "mlp.experts.gate_up_proj"), gu);
  mp.put(llama_layer(i, "mlp.experts.gate_up_proj_bias"), gu_b);
  mp.put(llama_layer(i, "mlp.experts.down_proj"), down);
  mp.put(llama_layer(i, "mlp.experts.down_proj_bias"), down_b);
  return Status::Ok();
}

Status gpt_oss_to_gale(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("model.embed_tokens.weight", {d.V, d.H}));
  mp.put("embedding.word_embeddings.weight", pad_rows(emb, d.Vp));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_ASSIGN_OR_RETURN(Tensor n1, mp.get(llama_layer(i, "input_layernorm.weight"), {d.H}));
    mp.put(gale_layer(i, "input_layernorm.weight"), n1);
    GALE_RETURN_IF_ERROR(gpt_oss_attention_to_gale(m, i, mp));
    GALE_ASSIGN_OR_RETURN(Tensor n2, mp.get(llama_layer(i, "post_attention_layernorm.weight"), {d.H}));
    mp.put(gale_layer(i, "pre_mlp_layernorm.weight"), n2);
    GALE_RETURN_IF_ERROR(gpt_oss_experts_to_gale(m, i, mp));
  }
  return final_norm_and_head_to_gale(m, d, mp);
}

Status gale_to_gpt_oss(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
  mp.put("model.embed_tokens.weight", rows(emb, 0, d.V));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_ASSIGN_OR_RETURN(Tensor n1, mp.get(gale_layer(i, "input_layernorm.weight"), {d.H}));
    mp.put(llama_layer(i, "input_layernorm.weight"), n1);
    GALE_RETURN_IF_ERROR(gale_to_gpt_oss_attention(m, i, mp));
    GALE_ASSIGN_OR_RETURN(Tensor n2, mp.get(gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    mp.put(llama_layer(i, "post_attention_layernorm.weight"), n2);
    GALE_RETURN_IF_ERROR(gale_experts_to_gpt_oss(m, i, mp));
  }
  return final_norm_and_head_to_hf(m, d, mp);
}

Status llama_to_gale(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  const bool qkv_bias = m.model.add_qkv_bias;
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("model.embed_tokens.weight", {d.V, d.H}));
  mp.put("embedding.word_embeddings.weight", pad_rows(emb, d.Vp));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_ASSIGN_OR_RETURN(Tensor n1, mp.get(llama_layer(i, "input_layernorm.weight"), {d.H}));
    mp.put(gale_layer(i, "input_layernorm.weight"), n1);
    GALE_ASSIGN_OR_RETURN(Tensor q, mp.get(llama_layer(i, "self_attn.q_proj.weight"), {d.NH * d.HD, d.H}));
    GALE_ASSIGN_OR_RETURN(Tensor k, mp.get(llama_layer(i, "self_attn.k_proj.weight"), {d.KV * d.HD, d.H}));
    GALE_ASSIGN_OR_RETURN(Tensor v, mp.get(llama_layer(i, "self_attn.v_proj.weight"), {d.KV * d.HD, d.H}));
    mp.put(gale_layer(i, "self_attention.linear_qkv.weight"), group_qkv(q, k, v, d.NH, d.KV, d.HD));
    if (m.model.qk_layernorm) {  // Qwen3, Qwen3-MoE
      GALE_ASSIGN_OR_RETURN(Tensor qn, mp.get(llama_layer(i, "self_attn.q_norm.weight"), {d.HD}));
      mp.put(gale_layer(i, "self_attention.q_layernorm.weight"), qn);
      GALE_ASSIGN_OR_RETURN(Tensor kn, mp.get(llama_layer(i, "self_attn.k_norm.weight"), {d.HD}));
      mp.put(gale_layer(i, "self_attention.k_layernorm.weight"), kn);
    }
    if (qkv_bias) {
      GALE_ASSIGN_OR_RETURN(Tensor qb, mp.get(llama_layer(i, "self_attn.q_proj.bias"), {d.NH * d.HD}));
      GALE_ASSIGN_OR_RETURN(Tensor kb, mp.get(llama_layer(i, "self_attn.k_proj.bias"), {d.KV * d.HD}));
      GALE_ASSIGN_OR_RETURN(Tensor vb, mp.get(llama_layer(i, "self_attn.v_proj.bias"), {d.KV * d.HD}));
      mp.put(gale_layer(i, "self_attention.linear_qkv.bias"), group_qkv(qb, kb, vb, d.NH, d.KV, d.HD));
    }
    GALE_ASSIGN_OR_RETURN(Tensor o, mp.get(llama_layer(i, "self_attn.o_proj.weight"), {d.H, d.NH * d.HD}));
    mp.put(gale_layer(i, "self_attention.linear_proj.weight"), o);
    GALE_ASSIGN_OR_RETURN(Tensor n2, mp.get(llama_layer(i, "post_attention_layernorm.weight"), {d.H}));
    mp.put(gale_layer(i, "pre_mlp_layernorm.weight"), n2);
    if (moe_layer(m, i)) {
      GALE_RETURN_IF_ERROR(m.arch == HfArchitecture::kMixtral ? mixtral_experts_to_gale(m, i, mp)
                                                              : qwen_moe_experts_to_gale(m, i, mp));
      continue;
    }
    GALE_ASSIGN_OR_RETURN(Tensor gate, mp.get(llama_layer(i, "mlp.gate_proj.weight"), {d.F, d.H}));
    GALE_ASSIGN_OR_RETURN(Tensor up, mp.get(llama_layer(i, "mlp.up_proj.weight"), {d.F, d.H}));
    mp.put(gale_layer(i, "mlp.linear_fc1.weight"), concat_rows({gate, up}));
    GALE_ASSIGN_OR_RETURN(Tensor down, mp.get(llama_layer(i, "mlp.down_proj.weight"), {d.H, d.F}));
    mp.put(gale_layer(i, "mlp.linear_fc2.weight"), down);
  }
  GALE_RETURN_IF_ERROR(final_norm_and_head_to_gale(m, d, mp));
  return Status::Ok();
}

Status gale_to_llama(const HfModel& m, Mapper& mp) {
  const Dims d = dims(m);
  const int64_t qkv_rows = (d.NH + 2 * d.KV) * d.HD;
  GALE_ASSIGN_OR_RETURN(Tensor emb, mp.get("embedding.word_embeddings.weight", {d.Vp, d.H}));
  mp.put("model.embed_tokens.weight", rows(emb, 0, d.V));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_ASSIGN_OR_RETURN(Tensor n1, mp.get(gale_layer(i, "input_layernorm.weight"), {d.H}));
    mp.put(llama_layer(i, "input_layernorm.weight"), n1);
    GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(gale_layer(i, "self_attention.linear_qkv.weight"), {qkv_rows, d.H}));
    std::vector<Tensor> w = split_qkv(qkv, d.NH, d.KV, d.HD);
    mp.put(llama_layer(i, "self_attn.q_proj.weight"), w[0]);
    mp.put(llama_layer(i, "self_attn.k_proj.weight"), w[1]);
    mp.put(llama_layer(i, "self_attn.v_proj.weight"), w[2]);
    if (m.model.qk_layernorm) {  // Qwen3, Qwen3-MoE
      GALE_ASSIGN_OR_RETURN(Tensor qn, mp.get(gale_layer(i, "self_attention.q_layernorm.weight"), {d.HD}));
      mp.put(llama_layer(i, "self_attn.q_norm.weight"), qn);
      GALE_ASSIGN_OR_RETURN(Tensor kn, mp.get(gale_layer(i, "self_attention.k_layernorm.weight"), {d.HD}));
      mp.put(llama_layer(i, "self_attn.k_norm.weight"), kn);
    }
    if (m.model.add_qkv_bias) {
      GALE_ASSIGN_OR_RETURN(Tensor qkv_b, mp.get(gale_layer(i, "self_attention.linear_qkv.bias"), {qkv_rows}));
      std::vector<Tensor> b = split_qkv(qkv_b, d.NH, d.KV, d.HD);
      mp.put(llama_layer(i, "self_attn.q_proj.bias"), b[0]);
      mp.put(llama_layer(i, "self_attn.k_proj.bias"), b[1]);
      mp.put(llama_layer(i, "self_attn.v_proj.bias"), b[2]);
    }
    GALE_ASSIGN_OR_RETURN(Tensor o, mp.get(gale_layer(i, "self_attention.linear_proj.weight"), {d.H, d.NH * d.HD}));
    mp.put(llama_layer(i, "self_attn.o_proj.weight"), o);
    GALE_ASSIGN_OR_RETURN(Tensor n2, mp.get(gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    mp.put(llama_layer(i, "post_attention_layernorm.weight"), n2);
    if (moe_layer(m, i)) {
      GALE_RETURN_IF_ERROR(m.arch == HfArchitecture::kMixtral ? gale_experts_to_mixtral(m, i, mp)
                                                              : gale_experts_to_qwen_moe(m, i, mp));
      continue;
    }
    GALE_ASSIGN_OR_RETURN(Tensor fc1, mp.get(gale_layer(i, "mlp.linear_fc1.weight"), {2 * d.F, d.H}));
    mp.put(llama_layer(i, "mlp.gate_proj.weight"), rows(fc1, 0, d.F));
    mp.put(llama_layer(i, "mlp.up_proj.weight"), rows(fc1, d.F, d.F));
    GALE_ASSIGN_OR_RETURN(Tensor fc2, mp.get(gale_layer(i, "mlp.linear_fc2.weight"), {d.H, d.F}));
    mp.put(llama_layer(i, "mlp.down_proj.weight"), fc2);
  }
  GALE_RETURN_IF_ERROR(final_norm_and_head_to_hf(m, d, mp));
  return Status::Ok();
}

// One tensor between its Hugging Face name and its Gale name, either way, unchanged.
Status move_tensor(Mapper& mp, bool to_gale, const std::string& hf, const std::string& gale, const Shape& shape) {
  GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(to_gale ? hf : gale, shape));
  mp.put(to_gale ? gale : hf, std::move(t));
  return Status::Ok();
}

// A [vocabulary, H] tensor either way: V rows in Hugging Face's, padded to Vp in Gale's.
Status move_vocab_rows(Mapper& mp, bool to_gale, const std::string& hf, const std::string& gale, const Dims& d) {
  if (to_gale) {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(hf, {d.V, d.H}));
    mp.put(gale, pad_rows(t, d.Vp));
  } else {
    GALE_ASSIGN_OR_RETURN(Tensor t, mp.get(gale, {d.Vp, d.H}));
    mp.put(hf, rows(t, 0, d.V));
  }
  return Status::Ok();
}

// InternLM2 both ways: its names around LLaMA's block; attention.wqkv is already Megatron's grouped
// linear_qkv (per key/value group: its query heads, k, v), copied as is; feed_forward w1 (gate), w3 (up)
// -> linear_fc1 [gate; up], w2 -> linear_fc2.
Status map_internlm2(const HfModel& m, Mapper& mp, bool to_gale) {
  const Dims d = dims(m);
  const int64_t qkv_rows = (d.NH + 2 * d.KV) * d.HD;
  auto one = [&](const std::string& hf, const std::string& gale, const Shape& shape) {
    return move_tensor(mp, to_gale, hf, gale, shape);
  };
  GALE_RETURN_IF_ERROR(move_vocab_rows(mp, to_gale, "model.tok_embeddings.weight", "embedding.word_embeddings.weight", d));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "attention_norm.weight"), gale_layer(i, "input_layernorm.weight"), {d.H}));
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "attention.wqkv.weight"), gale_layer(i, "self_attention.linear_qkv.weight"),
                             {qkv_rows, d.H}));
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "attention.wo.weight"), gale_layer(i, "self_attention.linear_proj.weight"),
                             {d.H, d.NH * d.HD}));
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "ffn_norm.weight"), gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    if (to_gale) {
      GALE_ASSIGN_OR_RETURN(Tensor gate, mp.get(llama_layer(i, "feed_forward.w1.weight"), {d.F, d.H}));
      GALE_ASSIGN_OR_RETURN(Tensor up, mp.get(llama_layer(i, "feed_forward.w3.weight"), {d.F, d.H}));
      mp.put(gale_layer(i, "mlp.linear_fc1.weight"), concat_rows({gate, up}));
    } else {
      GALE_ASSIGN_OR_RETURN(Tensor fc1, mp.get(gale_layer(i, "mlp.linear_fc1.weight"), {2 * d.F, d.H}));
      mp.put(llama_layer(i, "feed_forward.w1.weight"), rows(fc1, 0, d.F));
      mp.put(llama_layer(i, "feed_forward.w3.weight"), rows(fc1, d.F, d.F));
    }
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "feed_forward.w2.weight"), gale_layer(i, "mlp.linear_fc2.weight"), {d.H, d.F}));
  }
  GALE_RETURN_IF_ERROR(one("model.norm.weight", "decoder.final_layernorm.weight", {d.H}));
  if (!m.model.untie_embeddings_and_output_weights) return Status::Ok();
  return move_vocab_rows(mp, to_gale, "output.weight", "output_layer.weight", d);
}

// Phi-3 both ways: LLaMA's names but self_attn.qkv_proj = [q NH·HD; k KV·HD; v KV·HD] (regrouped per key/value
// group into linear_qkv) and mlp.gate_up_proj = [gate; up] (linear_fc1 as is).
Status map_phi3(const HfModel& m, Mapper& mp, bool to_gale) {
  const Dims d = dims(m);
  const int64_t qkv_rows = (d.NH + 2 * d.KV) * d.HD;
  auto one = [&](const std::string& hf, const std::string& gale, const Shape& shape) {
    return move_tensor(mp, to_gale, hf, gale, shape);
  };
  GALE_RETURN_IF_ERROR(move_vocab_rows(mp, to_gale, "model.embed_tokens.weight", "embedding.word_embeddings.weight", d));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "input_layernorm.weight"), gale_layer(i, "input_layernorm.weight"), {d.H}));
    if (to_gale) {
      GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(llama_layer(i, "self_attn.qkv_proj.weight"), {qkv_rows, d.H}));
      mp.put(gale_layer(i, "self_attention.linear_qkv.weight"),
             group_qkv(rows(qkv, 0, d.NH * d.HD), rows(qkv, d.NH * d.HD, d.KV * d.HD),
                       rows(qkv, (d.NH + d.KV) * d.HD, d.KV * d.HD), d.NH, d.KV, d.HD));
    } else {
      GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(gale_layer(i, "self_attention.linear_qkv.weight"), {qkv_rows, d.H}));
      mp.put(llama_layer(i, "self_attn.qkv_proj.weight"), concat_rows(split_qkv(qkv, d.NH, d.KV, d.HD)));
    }
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "self_attn.o_proj.weight"), gale_layer(i, "self_attention.linear_proj.weight"),
                             {d.H, d.NH * d.HD}));
    GALE_RETURN_IF_ERROR(
        one(llama_layer(i, "post_attention_layernorm.weight"), gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    GALE_RETURN_IF_ERROR(
        one(llama_layer(i, "mlp.gate_up_proj.weight"), gale_layer(i, "mlp.linear_fc1.weight"), {2 * d.F, d.H}));
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "mlp.down_proj.weight"), gale_layer(i, "mlp.linear_fc2.weight"), {d.H, d.F}));
  }
  return to_gale ? final_norm_and_head_to_gale(m, d, mp) : final_norm_and_head_to_hf(m, d, mp);
}

// A fused [q NH·HD; k KV·HD; v KV·HD] projection (weight or bias) <-> Megatron's linear_qkv, grouped per
// key/value group.
Status move_fused_qkv(Mapper& mp, bool to_gale, const std::string& hf, const std::string& gale, const Dims& d,
                      bool bias) {
  const int64_t n = (d.NH + 2 * d.KV) * d.HD;
  const Shape shape = bias ? Shape{n} : Shape{n, d.H};
  if (to_gale) {
    GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(hf, shape));
    mp.put(gale, group_qkv(rows(qkv, 0, d.NH * d.HD), rows(qkv, d.NH * d.HD, d.KV * d.HD),
                           rows(qkv, (d.NH + d.KV) * d.HD, d.KV * d.HD), d.NH, d.KV, d.HD));
  } else {
    GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(gale, shape));
    mp.put(hf, concat_rows(split_qkv(qkv, d.NH, d.KV, d.HD)));
  }
  return Status::Ok();
}

// Each row divided by its L2 norm (torch.nn.functional.normalize: by max(norm, 1e-12)), in double.
Tensor normalize_rows(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape());
  const int64_t R = t.size(0), C = cols_of(t);
  const float* in = t.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(in[r * C + c]) * in[r * C + c];
    const double norm = std::max(std::sqrt(sq), 1e-12);
    for (int64_t c = 0; c < C; ++c) o[r * C + c] = static_cast<float>(in[r * C + c] / norm);
  }
  return out;
}

// Baichuan2-7B both ways: LLaMA's names but self_attn.W_pack = [q; k; v] (multi-head, regrouped per head into
// linear_qkv), and lm_head a NormHead: normalised per row on the way in (what its forward multiplies by), written
// back as Gale holds it (the NormHead normalises it again, which changes nothing for unit rows).
Status map_baichuan(const HfModel& m, Mapper& mp, bool to_gale) {
  const Dims d = dims(m);
  auto one = [&](const std::string& hf, const std::string& gale, const Shape& shape) {
    return move_tensor(mp, to_gale, hf, gale, shape);
  };
  GALE_RETURN_IF_ERROR(move_vocab_rows(mp, to_gale, "model.embed_tokens.weight", "embedding.word_embeddings.weight", d));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "input_layernorm.weight"), gale_layer(i, "input_layernorm.weight"), {d.H}));
    GALE_RETURN_IF_ERROR(move_fused_qkv(mp, to_gale, llama_layer(i, "self_attn.W_pack.weight"),
                                        gale_layer(i, "self_attention.linear_qkv.weight"), d, /*bias=*/false));
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "self_attn.o_proj.weight"), gale_layer(i, "self_attention.linear_proj.weight"),
                             {d.H, d.NH * d.HD}));
    GALE_RETURN_IF_ERROR(
        one(llama_layer(i, "post_attention_layernorm.weight"), gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    if (to_gale) {
      GALE_RETURN_IF_ERROR(swiglu_mlp_to_gale(llama_layer(i, "mlp."), gale_layer(i, "mlp."), d.F, d.H, mp));
    } else {
      GALE_RETURN_IF_ERROR(gale_to_swiglu_mlp(gale_layer(i, "mlp."), llama_layer(i, "mlp."), d.F, d.H, mp));
    }
  }
  GALE_RETURN_IF_ERROR(one("model.norm.weight", "decoder.final_layernorm.weight", {d.H}));
  if (to_gale) {
    GALE_ASSIGN_OR_RETURN(Tensor head, mp.get("lm_head.weight", {d.V, d.H}));
    mp.put("output_layer.weight", pad_rows(normalize_rows(head), d.Vp));
    return Status::Ok();
  }
  return move_vocab_rows(mp, to_gale, "lm_head.weight", "output_layer.weight", d);
}

std::string chatglm_layer(int64_t i, const char* rest) {
  return "transformer.encoder.layers." + std::to_string(i) + "." + rest;
}

// ChatGLM3 / GLM-4 both ways: transformer.embedding / encoder.layers / encoder.final_layernorm / output_layer;
// query_key_value (weight and bias) = [q; k; v] regrouped per group, dense -> linear_proj, dense_h_to_4h =
// [gate; up] -> linear_fc1 as is, dense_4h_to_h -> linear_fc2. The saved rotary_pos_emb.inv_freq buffer (unread by
// ChatGLM's forward) is left on the way in and written back as 1 / 10000^(2i / (HD / 2)).
Status map_chatglm(const HfModel& m, Mapper& mp, bool to_gale) {
  const Dims d = dims(m);
  auto one = [&](const std::string& hf, const std::string& gale, const Shape& shape) {
    return move_tensor(mp, to_gale, hf, gale, shape);
  };
  GALE_RETURN_IF_ERROR(move_vocab_rows(mp, to_gale, "transformer.embedding.word_embeddings.weight",
                                       "embedding.word_embeddings.weight", d));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(one(chatglm_layer(i, "input_layernorm.weight"), gale_layer(i, "input_layernorm.weight"), {d.H}));
    GALE_RETURN_IF_ERROR(move_fused_qkv(mp, to_gale, chatglm_layer(i, "self_attention.query_key_value.weight"),
                                        gale_layer(i, "self_attention.linear_qkv.weight"), d, /*bias=*/false));
    if (m.model.add_qkv_bias)
      GALE_RETURN_IF_ERROR(move_fused_qkv(mp, to_gale, chatglm_layer(i, "self_attention.query_key_value.bias"),
                                          gale_layer(i, "self_attention.linear_qkv.bias"), d, /*bias=*/true));
    GALE_RETURN_IF_ERROR(one(chatglm_layer(i, "self_attention.dense.weight"),
                             gale_layer(i, "self_attention.linear_proj.weight"), {d.H, d.NH * d.HD}));
    GALE_RETURN_IF_ERROR(
        one(chatglm_layer(i, "post_attention_layernorm.weight"), gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    GALE_RETURN_IF_ERROR(
        one(chatglm_layer(i, "mlp.dense_h_to_4h.weight"), gale_layer(i, "mlp.linear_fc1.weight"), {2 * d.F, d.H}));
    GALE_RETURN_IF_ERROR(
        one(chatglm_layer(i, "mlp.dense_4h_to_h.weight"), gale_layer(i, "mlp.linear_fc2.weight"), {d.H, d.F}));
  }
  GALE_RETURN_IF_ERROR(one("transformer.encoder.final_layernorm.weight", "decoder.final_layernorm.weight", {d.H}));
  GALE_RETURN_IF_ERROR(move_vocab_rows(mp, to_gale, "transformer.output_layer.weight", "output_layer.weight", d));
  if (!to_gale) {
    const int64_t rot = d.HD / 2;
    Tensor inv = Tensor::empty({rot / 2});
    for (int64_t i = 0; i < rot / 2; ++i)
      inv.data<float>()[i] = static_cast<float>(1.0 / std::pow(10000.0, static_cast<double>(2 * i) / rot));
    mp.put("transformer.rotary_pos_emb.inv_freq", inv);
  }
  return Status::Ok();
}

// Gemma-2 both ways: LLaMA's names and q/k/v regrouping with four norms per layer, mapped onto Gale's
// --post-norm layer by where they act (transformers' Gemma2DecoderLayer): input_layernorm before the
// attention, post_attention_layernorm on its output (post_attn_norm), pre_feedforward_layernorm before
// the MLP (pre_mlp_layernorm), post_feedforward_layernorm on its output (post_mlp_layernorm).
Status map_gemma2(const HfModel& m, Mapper& mp, bool to_gale) {
  const Dims d = dims(m);
  const int64_t qkv_rows = (d.NH + 2 * d.KV) * d.HD;
  auto one = [&](const std::string& hf, const std::string& gale, const Shape& shape) {
    return move_tensor(mp, to_gale, hf, gale, shape);
  };
  GALE_RETURN_IF_ERROR(move_vocab_rows(mp, to_gale, "model.embed_tokens.weight", "embedding.word_embeddings.weight", d));
  for (int64_t i = 0; i < m.model.num_layers; ++i) {
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "input_layernorm.weight"), gale_layer(i, "input_layernorm.weight"), {d.H}));
    if (to_gale) {
      GALE_ASSIGN_OR_RETURN(Tensor q, mp.get(llama_layer(i, "self_attn.q_proj.weight"), {d.NH * d.HD, d.H}));
      GALE_ASSIGN_OR_RETURN(Tensor k, mp.get(llama_layer(i, "self_attn.k_proj.weight"), {d.KV * d.HD, d.H}));
      GALE_ASSIGN_OR_RETURN(Tensor v, mp.get(llama_layer(i, "self_attn.v_proj.weight"), {d.KV * d.HD, d.H}));
      mp.put(gale_layer(i, "self_attention.linear_qkv.weight"), group_qkv(q, k, v, d.NH, d.KV, d.HD));
    } else {
      GALE_ASSIGN_OR_RETURN(Tensor qkv, mp.get(gale_layer(i, "self_attention.linear_qkv.weight"), {qkv_rows, d.H}));
      std::vector<Tensor> w = split_qkv(qkv, d.NH, d.KV, d.HD);
      mp.put(llama_layer(i, "self_attn.q_proj.weight"), w[0]);
      mp.put(llama_layer(i, "self_attn.k_proj.weight"), w[1]);
      mp.put(llama_layer(i, "self_attn.v_proj.weight"), w[2]);
    }
    if (m.model.qk_layernorm) {  // Gemma-3's q_norm / k_norm [head_dim]
      GALE_RETURN_IF_ERROR(
          one(llama_layer(i, "self_attn.q_norm.weight"), gale_layer(i, "self_attention.q_layernorm.weight"), {d.HD}));
      GALE_RETURN_IF_ERROR(
          one(llama_layer(i, "self_attn.k_norm.weight"), gale_layer(i, "self_attention.k_layernorm.weight"), {d.HD}));
    }
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "self_attn.o_proj.weight"), gale_layer(i, "self_attention.linear_proj.weight"),
                             {d.H, d.NH * d.HD}));
    GALE_RETURN_IF_ERROR(
        one(llama_layer(i, "post_attention_layernorm.weight"), gale_layer(i, "post_attn_norm.weight"), {d.H}));
    GALE_RETURN_IF_ERROR(
        one(llama_layer(i, "pre_feedforward_layernorm.weight"), gale_layer(i, "pre_mlp_layernorm.weight"), {d.H}));
    if (to_gale) {
      GALE_ASSIGN_OR_RETURN(Tensor gate, mp.get(llama_layer(i, "mlp.gate_proj.weight"), {d.F, d.H}));
      GALE_ASSIGN_OR_RETURN(Tensor up, mp.get(llama_layer(i, "mlp.up_proj.weight"), {d.F, d.H}));
      mp.put(gale_layer(i, "mlp.linear_fc1.weight"), concat_rows({gate, up}));
    } else {
      GALE_ASSIGN_OR_RETURN(Tensor fc1, mp.get(gale_layer(i, "mlp.linear_fc1.weight"), {2 * d.F, d.H}));
      mp.put(llama_layer(i, "mlp.gate_proj.weight"), rows(fc1, 0, d.F));
      mp.put(llama_layer(i, "mlp.up_proj.weight"), rows(fc1, d.F, d.F));
    }
    GALE_RETURN_IF_ERROR(one(llama_layer(i, "mlp.down_proj.weight"), gale_layer(i, "mlp.linear_fc2.weight"), {d.H, d.F}));
    GALE_RETURN_IF_ERROR(
        one(llama_layer(i, "post_feedforward_layernorm.weight"), gale_layer(i, "post_mlp_layernorm.weight"), {d.H}));
  }
  return to_gale ? final_norm_and_head_to_gale(m, d, mp) : final_norm_and_head_to_hf(m, d, mp);
}

}  // namespace

StatusOr<std::vector<NamedTensor>> gale_tensors_from_hf(const HfModel& m, const TensorSource& hf, DType store) {
  Mapper mp(hf, store);
  GALE_RETURN_IF_ERROR(m.arch == HfArchitecture::kGpt2         ? gpt2_to_gale(m, mp)
                       : m.arch == HfArchitecture::kBloom      ? map_bloom(m, mp, /*to_gale=*/true)
                       : m.arch == HfArchitecture::kDeepseekV3 ? deepseek_v3_to_gale(m, mp)
                       : m.arch == HfArchitecture::kQwen3Next  ? qwen3_next_to_gale(m, mp)
                       : m.arch == HfArchitecture::kGptOss     ? gpt_oss_to_gale(m, mp)
                       : m.arch == HfArchitecture::kInternLM2  ? map_internlm2(m, mp, /*to_gale=*/true)
                       : m.arch == HfArchitecture::kPhi3       ? map_phi3(m, mp, /*to_gale=*/true)
                       : m.arch == HfArchitecture::kBaichuan   ? map_baichuan(m, mp, /*to_gale=*/true)
                       : m.arch == HfArchitecture::kChatGLM    ? map_chatglm(m, mp, /*to_gale=*/true)
                       : m.arch == HfArchitecture::kGemma2 || m.arch == HfArchitecture::kGemma3
                           ? map_gemma2(m, mp, /*to_gale=*/true)
                                                               : llama_to_gale(m, mp));
  return mp.take();
}

StatusOr<std::vector<NamedTensor>> hf_tensors_from_gale(const HfModel& m, const TensorSource& gale, DType store) {
  Mapper mp(gale, store);
  GALE_RETURN_IF_ERROR(m.arch == HfArchitecture::kGpt2         ? gale_to_gpt2(m, mp)
                       : m.arch == HfArchitecture::kBloom      ? map_bloom(m, mp, /*to_gale=*/false)
                       : m.arch == HfArchitecture::kDeepseekV3 ? gale_to_deepseek_v3(m, mp)
                       : m.arch == HfArchitecture::kQwen3Next  ? gale_to_qwen3_next(m, mp)
                       : m.arch == HfArchitecture::kGptOss     ? gale_to_gpt_oss(m, mp)
                       : m.arch == HfArchitecture::kInternLM2  ? map_internlm2(m, mp, /*to_gale=*/false)
                       : m.arch == HfArchitecture::kPhi3       ? map_phi3(m, mp, /*to_gale=*/false)
                       : m.arch == HfArchitecture::kBaichuan   ? map_baichuan(m, mp, /*to_gale=*/false)
                       : m.arch == HfArchitecture::kChatGLM    ? map_chatglm(m, mp, /*to_gale=*/false)
                       : m.arch == HfArchitecture::kGemma2 || m.arch == HfArchitecture::kGemma3
                           ? map_gemma2(m, mp, /*to_gale=*/false)
                                                               : gale_to_llama(m, mp));
  return mp.take();
}

std::vector<std::pair<std::string, std::string>> hf_mtp_shared_copies(const HfModel& m) {
  std::vector<std::pair<std::string, std::string>> out;
  const char* head = m.model.untie_embeddings_and_output_weights ? "lm_head.weight" : "model.embed_tokens.weight";
  for (int64_t k = 0; k < m.mtp_layers; ++k) {
    const std::string hf = hf_layer_prefix(m.model.num_layers + k);
    out.push_back({hf + "embed_tokens.weight", "model.embed_tokens.weight"});
    out.push_back({hf + "shared_head.head.weight", head});
  }
  return out;
}

bool hf_tensor_ignorable(const HfModel& m, const std::string& name) {
  auto ends_with = [&](std::string_view s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with("rotary_emb.inv_freq")) return true;
  if (m.arch == HfArchitecture::kChatGLM) return name == "transformer.rotary_pos_emb.inv_freq";
  // DeepSeek's multi-token-prediction layers model.layers.{L + k} left out (--mtp-num-layers below
  // num_nextn_predict_layers).
  if (m.arch == HfArchitecture::kDeepseekV3 && name.rfind("model.layers.", 0) == 0) {
    const size_t at = std::strlen("model.layers.");
    size_t end = at;
    while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
    if (end > at && end - at < 10 && std::stoll(name.substr(at, end - at)) >= m.model.num_layers + m.mtp_layers &&
        std::stoll(name.substr(at, end - at)) < m.model.num_layers + m.mtp_layers_in_files)
      return true;
  }
  // Qwen3-Next's multi-token-prediction layers (mtp.*), which transformers does not load either.
  if (m.arch == HfArchitecture::kQwen3Next && name.rfind("mtp.", 0) == 0) return true;
  if (m.arch == HfArchitecture::kGpt2 && (ends_with(".attn.bias") || ends_with(".attn.masked_bias"))) return true;
  if (m.arch == HfArchitecture::kInternLM2) return name == "output.weight" && !m.model.untie_embeddings_and_output_weights;
  return name == "lm_head.weight" && !m.model.untie_embeddings_and_output_weights;
}

}  // namespace gale
