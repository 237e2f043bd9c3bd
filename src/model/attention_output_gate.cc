// --attention-output-gate: the gate rows' split and merge, and the sigmoid gate's forward and backward.
#include "model/attention_output_gate.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace gale {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Per token and group: the gated layout's offsets of q, gate and k/v, and the plain layout's.
struct GroupRows {
  int64_t q, kv;  // NHl/KVl·HD query (and gate) values, 2·HD key and value values
  int64_t gated() const { return 2 * q + kv; }
  int64_t plain() const { return q + kv; }
};

GroupRows group_rows(int64_t NHl, int64_t KVl, int64_t HD) {
  GALE_CHECK(KVl > 0 && NHl % KVl == 0) << NHl << " query heads in " << KVl << " groups";
  return GroupRows{NHl / KVl * HD, 2 * HD};
}

}  // namespace

Tensor split_output_gate(const Tensor& qkv_gated, int64_t NHl, int64_t KVl, int64_t HD, Tensor* gate) {
  const GroupRows g = group_rows(NHl, KVl, HD);
  const int64_t T = qkv_gated.size(0);
  GALE_CHECK_EQ(qkv_gated.size(1), KVl * g.gated());
  Tensor qkv = Tensor::empty({T, KVl * g.plain()});
  *gate = Tensor::empty({T, NHl * HD});
  const float* in = qkv_gated.data<float>();
  float* out = qkv.data<float>();
  float* gt = gate->data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < KVl; ++k) {
      const float* src = in + t * KVl * g.gated() + k * g.gated();
      float* dst = out + t * KVl * g.plain() + k * g.plain();
      std::copy_n(src, g.q, dst);                          // q
      std::copy_n(src + g.q, g.q, gt + t * NHl * HD + k * g.q);  // gate
      std::copy_n(src + 2 * g.q, g.kv, dst + g.q);         // k, v
    }
  return qkv;
}

Tensor merge_output_gate(const Tensor& d_qkv, const Tensor& d_gate, int64_t NHl, int64_t KVl, int64_t HD) {
  const GroupRows g = group_rows(NHl, KVl, HD);
  const int64_t T = d_qkv.size(0);
  GALE_CHECK_EQ(d_qkv.size(1), KVl * g.plain());
  GALE_CHECK(d_gate.size(0) == T && d_gate.size(1) == NHl * HD);
  Tensor out = Tensor::empty({T, KVl * g.gated()});
  const float* dq = d_qkv.data<float>();
  const float* dg = d_gate.data<float>();
  float* o = out.data<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < KVl; ++k) {
      const float* src = dq + t * KVl * g.plain() + k * g.plain();
      float* dst = o + t * KVl * g.gated() + k * g.gated();
      std::copy_n(src, g.q, dst);
      std::copy_n(dg + t * NHl * HD + k * g.q, g.q, dst + g.q);
      std::copy_n(src + g.q, g.kv, dst + 2 * g.q);
    }
  return out;
}

void output_gate_forward(const float* ctx, const float* gate, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ctx[i] * sigmoid(gate[i]);
}

void output_gate_backward(const float* d_out, const float* ctx, const float* gate, float* d_ctx, float* d_gate,
                          int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(gate[i]);
    d_gate[i] = d_out[i] * ctx[i] * s * (1.0f - s);
    d_ctx[i] = d_out[i] * s;
  }
}

}  // namespace gale
