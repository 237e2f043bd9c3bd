// A tiny hybrid Mamba model (Mamba, attention and MLP layers) with random weights whose Mamba state
// carries far, for the hybrid decoding tests (model/decoding_check.h gives its greedy reference).
#pragma once

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

}  // namespace gale::testing
