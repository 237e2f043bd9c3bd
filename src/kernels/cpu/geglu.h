// GeGLU, the gated MLP activation of MindSpeed-LLM's --geglu / --gelu-tanh (Gemma): reference kernels (level 0).
// The fused builds (level 2, --use-fused-swiglu) are in kernels/cpu/fused_geglu.h.
#pragma once

#include <cstdint>

namespace gale {

// Which GeLU the gate goes through: the exact erf one (torch's F.gelu, MindSpeed-LLM's --geglu) or
// the tanh approximation (Hugging Face's gelu_pytorch_tanh, MindSpeed-LLM's --gelu-tanh).
enum class GegluGate { kErf, kTanh };

// u is [rows, 2F] (gate a = u[:, :F], linear half b = u[:, F:]), fc1's output. With a bias
// [2F] the bias is first added to u in place (as the OpTable activation entries do); then
// act[rows, F] = gelu(a)·b.
void geglu_forward_ref(GegluGate gate, float* u, const float* bias, float* act, int64_t rows, int64_t F);

// du[rows, 2F] (written) from dact[rows, F] and the forward's u (after the bias): du_a =
// dact·b·gelu'(a), du_b = dact·gelu(a). With dbias [2F], the column sums of du are added to it.
void geglu_backward_ref(GegluGate gate, const float* dact, const float* u, float* du, float* dbias, int64_t rows,
                        int64_t F);

// The signatures of the two kernels, shared by the reference and the fused builds.
using GegluForwardFn = void (*)(GegluGate gate, float* u, const float* bias, float* act, int64_t rows, int64_t F);
using GegluBackwardFn = void (*)(GegluGate gate, const float* dact, const float* u, float* du, float* dbias,
                                 int64_t rows, int64_t F);

}  // namespace gale
