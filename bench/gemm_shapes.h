// The GEMMs of one training step of the two benchmark models (bench/README.md), as row-major sgemm calls.
//
// Models: (a) GPT-2-small: hidden 768, 12 heads, ffn 3072, seq 256, micro-batch 4 (so 1024
// tokens), vocab 50304; (b) the LLaMA-style model of the same size: SwiGLU ffn 2048 (fc1 out 4096),
// 4 query groups (QKV out (12 + 2*4)*64 = 1280), no biases, untied output layer. A linear layer
// with weight W[out, in] and input X[T, in] runs three GEMMs per step:
//   fwd          Y[T, out]  = X · Wᵀ                 M=T   N=out K=in   (N, T)
//   bwd-data     dX[T, in]  = dY · W                 M=T   N=in  K=out  (N, N)
//   bwd-weight   dW[out,in] += dYᵀ · X  (beta = 1)   M=out N=in  K=T    (T, N)
// Attention runs per (micro-batch, head) pair, B·NH = 48 of them, with S = 256 and HD = 64:
//   qk   S×S×HD (N, T): scores = Q·Kᵀ and, backward, dP = dO·Vᵀ
//   pv   S×HD×S (N, N): ctx = P·V and, backward, dQ = dS·K
//   tn   S×HD×S (T, N): dV = Pᵀ·dO and dK = dSᵀ·Q
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gale::bench {

struct GemmShape {
  std::string name;  // "gpt.fc1/fwd", "attn.qk"
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float beta = 0;
  int64_t batch = 1;  // independent GEMMs of this shape (attention heads)

  // Row strides of A, B and C as stored (row-major, op applied on top).
  int64_t lda() const { return trans_a ? M : K; }
  int64_t ldb() const { return trans_b ? K : N; }
  int64_t ldc() const { return N; }
  int64_t a_elems() const { return M * K; }
  int64_t b_elems() const { return K * N; }
  int64_t c_elems() const { return M * N; }
  double flops() const { return 2.0 * static_cast<double>(M) * N * K * batch; }
};

struct ModelGemmConfig {
  std::string name = "gpt";  // or "llama"
  int64_t tokens = 1024;     // micro-batch × sequence
  int64_t hidden = 768;
  int64_t qkv_out = 2304;  // (NH + 2·KV)·HD
  int64_t fc1_out = 3072;  // F, or 2F with SwiGLU
  int64_t fc2_in = 3072;   // F
  int64_t vocab = 50304;
  int64_t layers = 12;
  int64_t heads_batch = 48;  // B·NH
  int64_t seq = 256;
  int64_t head_dim = 64;
};

inline ModelGemmConfig gpt2_small_config() { return ModelGemmConfig{}; }

inline ModelGemmConfig llama_small_config() {
  ModelGemmConfig c;
  c.name = "llama";
  c.qkv_out = (12 + 2 * 4) * 64;
  c.fc1_out = 2 * 2048;
  c.fc2_in = 2048;
  return c;
}

// The three GEMMs of a linear layer `layer` (in → out) over `tokens` rows.
inline std::vector<GemmShape> linear_gemms(const std::string& layer, int64_t tokens, int64_t in, int64_t out) {
  return {
      {layer + "/fwd", false, true, tokens, out, in, 0.0f, 1},
      {layer + "/bwd-data", false, false, tokens, in, out, 0.0f, 1},
      {layer + "/bwd-weight", true, false, out, in, tokens, 1.0f, 1},
  };
}

inline std::vector<GemmShape> attention_gemms(const ModelGemmConfig& c) {
  return {
      {"attn.qk", false, true, c.seq, c.seq, c.head_dim, 0.0f, c.heads_batch},
      {"attn.pv", false, false, c.seq, c.head_dim, c.seq, 0.0f, c.heads_batch},
      {"attn.tn", true, false, c.seq, c.head_dim, c.seq, 0.0f, c.heads_batch},
  };
}

// A GEMM and how many times one training step runs it.
struct StepGemm {
  GemmShape shape;
  int64_t count = 0;
};

// Every GEMM of one training step (one micro-batch) of model `c`; layer names are prefixed with
// the model name except the projection and output layer, which both models share ("proj",
// "output"), and attention ("attn.*").
inline std::vector<StepGemm> step_gemms(const ModelGemmConfig& c) {
  std::vector<StepGemm> all;
  auto add_linear = [&](const std::string& layer, int64_t in, int64_t out, int64_t count) {
    for (auto& g : linear_gemms(layer, c.tokens, in, out)) all.push_back({g, count});
  };
  add_linear(c.name + ".qkv", c.hidden, c.qkv_out, c.layers);
  add_linear("proj", c.hidden, c.hidden, c.layers);
  add_linear(c.name + ".fc1", c.hidden, c.fc1_out, c.layers);
  add_linear(c.name + ".fc2", c.fc2_in, c.hidden, c.layers);
  add_linear("output", c.hidden, c.vocab, 1);
  for (auto& g : attention_gemms(c)) all.push_back({g, 2 * c.layers});
  return all;
}

// The distinct GEMMs of both models, in a stable order (the benchmark's rows).
inline std::vector<GemmShape> distinct_model_gemms() {
  std::vector<GemmShape> out;
  for (const auto& cfg : {gpt2_small_config(), llama_small_config()}) {
    for (const auto& sg : step_gemms(cfg)) {
      bool seen = false;
      for (const auto& g : out) seen = seen || g.name == sg.shape.name;
      if (!seen) out.push_back(sg.shape);
    }
  }
  return out;
}

}  // namespace gale::bench
