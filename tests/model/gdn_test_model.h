// A tiny Gated DeltaNet model (GDN and full-attention layers) with random weights whose GDN state
// carries far, for the GDN decoding tests (model/decoding_check.h gives its greedy reference).
#pragma once

#include <string>
#include <vector>

#include "model/gpt_model.h"
#include "model/tiny_model_training.h"

namespace gale::testing {

// The tiny LLaMA-style model (RoPE, GQA, SwiGLU, RMSNorm, hidden 48) with 5 layers G * G G *
// (G: Gated DeltaNet of 2 key heads and 4 value heads, DK 8, DV 6, convolution width 4).
inline ModelConfig tiny_gdn_config() {
  ModelConfig c = tiny_llama_config();
  c.num_layers = 5;
  c.max_positions = 48;
  c.gdn.enabled = true;
  c.gdn.pattern = {1, 0, 1, 1, 0};
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 8;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 4;
  return c;
}

// Megatron's initial A_log = log U(1, 16) makes the delta rule forget within a few steps
// (exp(g) ≤ e^−1.3); A_log ≈ −1.2 (exp(g) ≈ 0.7) and a larger convolution make every position's
// state reach the logits.
inline void make_gdn_state_carry(GPTModel& m) {
  ParamBuffer& pb = m.params();
  const ModelConfig& c = m.config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.gdn.is_gdn_layer(l)) continue;
    const std::string p = "decoder.layers." + std::to_string(l) + ".self_attention.";
    for (const char* name : {"A_log", "conv1d.weight"}) {
      const int id = pb.find(p + name);
      GALE_CHECK(id >= 0) << p << name;
      std::vector<float> v(static_cast<size_t>(pb.spec(id).local_numel()));
      fill_random(v.data(), static_cast<int64_t>(v.size()), 500 + static_cast<uint64_t>(id), 0.2f);
      const std::string n = name;
      for (float& x : v) x = n == "A_log" ? x - 1.2f : 4.0f * x;
      pb.set_param_values(id, v.data());
    }
  }
}

}  // namespace gale::testing
