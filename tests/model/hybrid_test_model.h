// A tiny hybrid Mamba model (Mamba, attention and MLP layers) with random weights whose Mamba state
// carries far, and its greedy reference by full forwards, for the hybrid decoding tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/gpt_model.h"
#include "model/tiny_model_training.h"

namespace gale::testing {

// The tiny LLaMA-style model's sizes (RoPE, GQA, hidden 48: d_inner 96 in 6 heads of 16, 2 groups,
// d_state 8, d_conv 4) with the layers M * - M * M.
inline ModelConfig tiny_hybrid_config() {
  ModelConfig c = tiny_llama_config();
  c.num_layers = 6;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M*-M*M";
  c.hybrid.headdim = 16;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 8;
  c.max_positions = 48;
  return c;
}

// The same sizes with a MoE layer ('E') in the MLP layer's place, M * E M * M: 4 experts of FFN 32,
// top-2, a shared expert of FFN 32.
inline ModelConfig tiny_hybrid_moe_config() {
  ModelConfig c = tiny_hybrid_config();
  c.hybrid.layers = "M*EM*M";
  c.add_bias_linear = false;  // as the LLaMA architecture: the shared expert has no biases
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn = 32;
  c.moe.shared_ffn = 32;
  c.moe.pattern = {0, 0, 1, 0, 0, 0};
  return c;
}

// Megatron's initial Δ ≤ 0.1 and A down to −16 make the scan forget within a few steps; Δ ≈ 1 and
// A ≈ −0.3 (exp(Δ·A) ≈ 0.75) and a larger convolution make every position's state reach the logits.
inline void make_mamba_state_carry(GPTModel& m) {
  ParamBuffer& pb = m.params();
  const ModelConfig& c = m.config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.hybrid.is_mamba_layer(l)) continue;
    const std::string p = "decoder.layers." + std::to_string(l) + ".mixer.";
    for (const char* name : {"A_log", "dt_bias", "conv1d.weight"}) {
      const int id = pb.find(p + name);
      GALE_CHECK(id >= 0) << p << name;
      std::vector<float> v(static_cast<size_t>(pb.spec(id).local_numel()));
      fill_random(v.data(), static_cast<int64_t>(v.size()), 300 + static_cast<uint64_t>(id), 0.2f);
      const std::string n = name;
      for (float& x : v) x += n == "A_log" ? -1.2f : n == "dt_bias" ? 0.5f : 0.0f;
      if (n == "conv1d.weight")
        for (float& x : v) x *= 4.0f;
      pb.set_param_values(id, v.data());
    }
  }
}

// The logits row [V] after `ids` by a whole-sequence forward (no cache: every position from scratch).
inline std::vector<float> full_forward_last_logits(GPTModel& m, const std::vector<int32_t>& ids) {
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(ids.size());
  mb.tokens = ids;
  mb.position_ids.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) mb.position_ids[i] = static_cast<int32_t>(i);
  const Tensor l = m.forward_logits(mb, Tensor());
  const int64_t V = m.config().vocab;
  return std::vector<float>(l.data<float>() + (mb.S - 1) * V, l.data<float>() + mb.S * V);
}

// max |got − want| / max |want| over a logits row.
inline double logits_rel_diff(const float* got, const std::vector<float>& want) {
  double diff = 0.0, scale = 1e-30;
  for (size_t v = 0; v < want.size(); ++v) {
    diff = std::max(diff, std::abs(static_cast<double>(got[v]) - want[v]));
    scale = std::max(scale, std::abs(static_cast<double>(want[v])));
  }
  return diff / scale;
}

inline int32_t argmax_row(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace gale::testing
