// --qk-clip / --log-max-attention-logit: reduce the step's max attention logits and rescale the q/k projections.
#include "model/qk_clip.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "model/layer_shares.h"

namespace gale {

namespace {

// η = min(τ / m, 1) in f32, as Megatron's torch.clamp on its f32 maxima; a head never seen (-inf)
// keeps its weights.
float balancing_eta(float m, double threshold) {
  if (!std::isfinite(m)) return 1.0f;
  return std::min(static_cast<float>(threshold) / m, 1.0f);
}

// Multiplies `rows` consecutive rows of `cols` floats at `w` by f.
void scale_rows(float* w, int64_t rows, int64_t cols, float f) {
  for (int64_t i = 0; i < rows * cols; ++i) w[i] *= f;
}

}  // namespace

bool qk_clip_qkv_rows(float* w, int64_t cols, int64_t KVl, int64_t per_group, int64_t HD,
                      const std::vector<float>& max_logits, const QkClipOptions& o) {
  GALE_CHECK_EQ(static_cast<int64_t>(max_logits.size()), KVl * per_group) << "qk-clip: max attention logits per head";
  const float alpha = static_cast<float>(o.alpha);
  std::vector<float> group_max(static_cast<size_t>(KVl), -std::numeric_limits<float>::infinity());
  bool any = false;
  for (int64_t g = 0; g < KVl; ++g) {
    float& m = group_max[static_cast<size_t>(g)];
    for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) m = std::max(m, max_logits[static_cast<size_t>(h)]);
    any = any || m > static_cast<float>(o.threshold);
  }
  if (!any) return false;
  for (int64_t g = 0; g < KVl; ++g) {
    const float eta = balancing_eta(group_max[static_cast<size_t>(g)], o.threshold);
    float* rows = w + g * (per_group + 2) * HD * cols;
    scale_rows(rows, per_group * HD, cols, std::pow(eta, alpha));
    scale_rows(rows + per_group * HD * cols, HD, cols, std::pow(eta, 1.0f - alpha));
  }
  return true;
}

bool qk_clip_mla_rows(float* q, int64_t q_cols, float* kv, int64_t kv_cols, int64_t Dn, int64_t R, int64_t Dv,
                      const std::vector<float>& max_logits, const QkClipOptions& o) {
  const float alpha = static_cast<float>(o.alpha);
  bool any = false;
  for (float m : max_logits) any = any || m > static_cast<float>(o.threshold);
  if (!any) return false;
  for (size_t h = 0; h < max_logits.size(); ++h) {
    const float eta = balancing_eta(max_logits[h], o.threshold);
    float* qh = q + static_cast<int64_t>(h) * (Dn + R) * q_cols;
    scale_rows(qh, Dn, q_cols, std::pow(eta, alpha));
    scale_rows(qh + Dn * q_cols, R, q_cols, eta);
    scale_rows(kv + static_cast<int64_t>(h) * (Dn + Dv) * kv_cols, Dn, kv_cols, std::pow(eta, 1.0f - alpha));
  }
  return true;
}

bool qk_clip_layer(ParamBuffer& pb, const ModelConfig& c, const ModelPartition& part, const LayerParamIds& w,
                   const std::vector<float>& max_logits, const QkClipOptions& o) {
  const LayerShares shares = layer_shares(c, part);
  const int64_t NHl = shares.heads;
  GALE_CHECK_EQ(static_cast<int64_t>(max_logits.size()), NHl) << "qk-clip: max attention logits per head";
  if (w.mla.defined()) {
    const MlaConfig& mla = c.mla;
    const int q_id = mla.q_lora_rank > 0 ? w.mla.q_up : w.mla.q_proj;
    return qk_clip_mla_rows(pb.param_data(q_id), pb.param(q_id).size(1), pb.param_data(w.mla.kv_up),
                            pb.param(w.mla.kv_up).size(1), mla.qk_head_dim, mla.qk_pos_emb_head_dim, mla.v_head_dim,
                            max_logits, o);
  }
  GALE_CHECK(w.qkv_w >= 0) << "qk-clip: a layer with attention logits but no linear_qkv";
  const int64_t KVl = shares.groups, HD = c.head_dim;
  GALE_CHECK(KVl > 0 && NHl % KVl == 0 && shares.qkv_rows_per_group == (NHl / KVl + 2) * HD)
      << "qk-clip: linear_qkv's rows are not (NH/KV + 2)·HD per query group";
  return qk_clip_qkv_rows(pb.param_data(w.qkv_w), pb.param(w.qkv_w).size(1), KVl, NHl / KVl, HD, max_logits, o);
}

double qk_clip_step(GPTModel& chunk, const QkClipOptions& o, Communicator* dp_cp) {
  const ModelConfig& c = chunk.config();
  const ModelPartition& part = chunk.partition();
  std::map<int64_t, std::vector<float>> all = chunk.take_max_attention_logits();
  // The decoder layers' maxima, in layer order, reduced in one all-reduce.
  std::vector<int64_t> layers;
  std::vector<float> flat;
  for (const auto& [layer, m] : all) {
    if (layer >= c.num_layers) continue;  // MTP layers: Megatron's clip_qk walks decoder.layers only
    layers.push_back(layer);
    flat.insert(flat.end(), m.begin(), m.end());
  }
  if (dp_cp && dp_cp->size() > 1 && !flat.empty())
    dp_cp->all_reduce(flat.data(), static_cast<int64_t>(flat.size()), DType::kF32, ReduceOp::kMax);
  double logged = 0.0;  // Megatron's log_max_attention_logit starts at 0
  size_t at = 0;
  for (int64_t layer : layers) {
    const size_t n = all[layer].size();
    const std::vector<float> m(flat.begin() + static_cast<std::ptrdiff_t>(at),
                               flat.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    for (float v : m) logged = std::max(logged, static_cast<double>(v));
    if (!o.clip) continue;
    const int64_t i = layer - part.first_layer;
    GALE_CHECK(i >= 0 && i < static_cast<int64_t>(chunk.layer_param_ids().size()))
        << "qk-clip: layer " << layer << " is not on this model chunk";
    qk_clip_layer(chunk.params(), c, part, chunk.layer_param_ids()[static_cast<size_t>(i)], m, o);
  }
  return logged;
}

}  // namespace gale
