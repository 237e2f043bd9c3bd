// Megatron / Transformer Engine FP8 training (--fp8-format, --fp8-recipe, ...), emulated: every GEMM
// operand of the transformer layers' linear layers is quantised to FP8 with its scale and
// dequantised back to f32 before Gale's f32 GEMM. The numerics of FP8 training, not its speed or
// memory (docs/model.md, "FP8 training").
//
// Which GEMMs: those of TE's Linear / LayerNormLinear modules in Megatron's TE layer spec — every
// transformer layer's (MTP layers' included) linear_qkv, linear_proj, linear_fc1 and linear_fc2
// (dense MLPs, routed and shared experts) and, with --multi-latent-attention, its five projections
// (the names of qat_selects, model/qat.h). Not the embedding, the output layer, the router, MTP's
// eh_proj or attention's softmax products. With --first-last-layers-bf16 the first
// --num-layers-at-start-in-bf16 and the last --num-layers-at-end-in-bf16 decoder layers (global
// numbering) are left alone (Megatron's get_fp8_context).
//
// The three GEMMs of a linear layer y = x·Wᵀ (model/linear.h), operands as TE quantises them:
//   forward  y  = Q_fwd(x) · Q_fwd(W)ᵀ       x: the input (kInput), W: the weight (kWeight)
//   dgrad    dx = Q_bwd(dy) · Q_fwd(W)      dy: the output gradient (kGradOutput)
//   wgrad    dW += Q_bwd(dy)ᵀ · Q_fwd(x)    (--no-fp8-wgrad: dyᵀ·x in the run's precision, f32 or bf16)
// Q_fwd uses E4M3; Q_bwd E4M3 (--fp8-format e4m3) or E5M2 (hybrid). The weight read is what the GEMM
// would read without FP8: the bf16 copy under --bf16, else the f32 master. Dequantised values are
// f32 and the GEMM runs in f32 (the FP8 GEMM's f32 accumulation). Backward is straight-through.
//
// Recipes (Q of one operand):
//   delayed     per tensor, with the scale of the delayed-scaling state (kernels/cpu/fp8_scaling.h):
//               one amax history [len, 3] and scale [3] per linear layer (kInput, kWeight,
//               kGradOutput), kept as two parameter-buffer tensors (ParamSpec::buffer: saved in
//               checkpoints like TE's module _extra_state, never trained):
//                 <module>._extra_state.fp8_amax_history   [--fp8-amax-history-len, 3], zeros at start
//                 <module>._extra_state.fp8_scale          [3], ones at start
//               A quantisation max-accumulates its tensor's amax into history row 0; the update
//               (update_fp8_delayed_scaling, once per training iteration after the backward of all
//               micro-batches) reduces row 0 over the amax group and applies fp8_delayed_update.
//   tensorwise  per tensor, current scaling: scale from this tensor's own amax (no state).
//   mxfp8       OCP MX (kernels/cpu/mx_quant.h): E8M0 scale per 32 elements along the GEMM's
//               reduction dimension (x and W along `in` forward; dy and W along `out` in dgrad; dy
//               and x along the rows in wgrad); E5M2 elements for dy under hybrid.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cpu/fp8_scaling.h"

namespace gale {

class ParamBuffer;

enum class Fp8Recipe : uint8_t { kDelayed, kTensorwise, kMxfp8 };
// The operands of a linear layer, in the order of its state's columns.
enum Fp8Role : int { kFp8Input = 0, kFp8Weight = 1, kFp8GradOutput = 2 };
inline constexpr int kFp8Roles = 3;

struct Fp8Config {
  bool enabled = false;  // --fp8-format given
  bool hybrid = false;   // --fp8-format hybrid: E5M2 gradients
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int margin = 0;                    // --fp8-margin
  int64_t amax_history_len = 1;      // --fp8-amax-history-len
  Fp8AmaxAlgo amax_algo = Fp8AmaxAlgo::kMostRecent;  // --fp8-amax-compute-algo
  bool wgrad = true;                 // false: --no-fp8-wgrad
  int64_t bf16_layers_at_start = 0;  // --first-last-layers-bf16's counts (0 without it)
  int64_t bf16_layers_at_end = 0;
  int64_t num_layers = 0;            // decoder layers (for the end count)

  Fp8Format format(Fp8Role role) const {
    return role == kFp8GradOutput && hybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  }
};

// --fp8-format ("" = none; e4m3 or hybrid), --fp8-recipe (delayed, tensorwise or mxfp8),
// --fp8-amax-compute-algo (most_recent or max). Errors name the flag.
StatusOr<Fp8Config> parse_fp8_config(const std::string& format, const std::string& recipe, int margin,
                                     int64_t amax_history_len, const std::string& amax_algo, bool wgrad);

// "delayed", "tensorwise" or "mxfp8".
const char* fp8_recipe_name(Fp8Recipe r);

// Whether the parameter called `name` is a linear weight whose GEMMs run in FP8 under `c`.
bool fp8_selects(const Fp8Config& c, const std::string& name);

// Marks every parameter fp8_selects picks (ParamSpec::fp8) and, for the delayed recipe, adds its
// two state buffers (ParamSpec::fp8_state: the history's id; the scale's is the next one). Before
// finalize. The ParamBuffer keeps a copy of `c` for linear_weight.
void add_fp8_params(ParamBuffer& pb, const Fp8Config& c);

// What a linear layer's GEMMs need (model/linear.h LinearWeight::fp8): the configuration (null:
// no FP8) and, for the delayed recipe, its history [len, 3] and scale [3].
struct Fp8Operands {
  const Fp8Config* config = nullptr;
  float* history = nullptr;
  float* scale = nullptr;
  bool active() const { return config != nullptr; }
};

// Q(x) for `role` as above, an f32 [rows, cols] tensor (x f32, bf16 or f16, 2-D). `reduce_cols`:
// the GEMM reduces along x's columns (MX blocks run along the rows' elements), else along its rows
// (MX blocks run down the columns). Per-tensor recipes ignore it. Delayed: records the amax.
Tensor fp8_quantise(const Tensor& x, const Fp8Operands& op, Fp8Role role, bool reduce_cols);
// The same for raw f32 values (rows × cols, row-major).
Tensor fp8_quantise(const float* x, int64_t rows, int64_t cols, const Fp8Operands& op, Fp8Role role,
                    bool reduce_cols);

// The delayed-scaling state of `pb` (every marked weight's history and scale), in parameter order.
struct Fp8StateRef {
  float* history;  // [len, 3]
  float* scale;    // [3]
};
std::vector<Fp8StateRef> fp8_delayed_states(ParamBuffer& pb);
// The update of a list of states whose row-0 amaxes were already reduced over the amax group.
void fp8_delayed_update_all(const std::vector<Fp8StateRef>& states, const Fp8Config& c);

}  // namespace gale
