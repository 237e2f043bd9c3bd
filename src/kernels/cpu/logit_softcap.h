// Logit soft-capping (Gemma-2): z -> C·tanh(z / C) and its gradient, for the LM head's logits and the attention scores.
//
// Forward: capped = C·tanh(z / C), which keeps every logit inside (−C, C) and is the identity to
// first order near 0. Backward: d z = d capped · (1 − tanh²(z / C)) = d capped · (1 − (capped / C)²),
// computed from the capped value, so no uncapped copy needs to be kept. C ≤ 0 means no capping.
#pragma once

#include <cmath>
#include <cstdint>

namespace gale {

inline float softcap_value(float z, float cap) { return cap * std::tanh(z / cap); }
// d z from d capped and the capped value.
inline float softcap_grad(float dcapped, float capped, float cap) {
  const float t = capped / cap;
  return dcapped * (1.0f - t * t);
}

// x[i] = C·tanh(x[i] / C) for i < n (nothing when cap ≤ 0). −inf stays −inf (tanh(−inf) = −1 would
// make it −C: callers cap before they mask).
inline void softcap_inplace(float* x, int64_t n, float cap) {
  if (cap <= 0.0f) return;
  for (int64_t i = 0; i < n; ++i) x[i] = softcap_value(x[i], cap);
}

}  // namespace gale
