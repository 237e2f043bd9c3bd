// Megatron's MoE upcycling (--moe-use-upcycling, --moe-upcycling-granularity): the dense tensor and slice each MoE parameter starts from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/params.h"
#include "train/arguments.h"

namespace gale {

// How a dense checkpoint becomes the MoE model (Megatron's upcycling_utils, arXiv:2410.07524).
// The dense model's FFN hidden size is --ffn-hidden-size × --moe-upcycling-granularity (what
// Megatron builds the dense model with); the granularity G actually used is that size divided by
// --moe-ffn-hidden-size (the experts' FFN size; the two agree unless --moe-ffn-hidden-size is
// given). The dense fc1 is cut along its rows into G slices (with --swiglu the gate half and the up
// half each into G, slice j = [gate_j; up_j]), fc2 along its columns; global expert e takes slice
// e mod G, so the experts form E/G groups of G that together hold the whole dense MLP. Expert e's
// router row becomes the initial row floor(e / G): a group's experts tie, and a top-k that takes
// whole groups weights every member equally. fc1 and fc2 weights (and the fc1 bias) are scaled by
// weight_scale so that the G slices, each weighted about 1/G, add up to the dense MLP (exactly for
// squared ReLU, to first order in the pre-activations for GeLU and SwiGLU); the fc2 bias is copied.
// Slices are cut from the whole-model dense tensor, so every TP/EP layout upcycles the same model.
struct UpcyclingPlan {
  int64_t granularity = 1;     // G = dense_ffn / expert_ffn
  int64_t expansion_rate = 1;  // E / G: copies of each slice
  int64_t dense_ffn = 0;       // --ffn-hidden-size × --moe-upcycling-granularity
  int64_t expert_ffn = 0;      // --moe-ffn-hidden-size (Fe)
  bool glu = false;            // --swiglu: fc1 rows are [gate (Fe); up (Fe)]
  // Megatron's moe_activation_scale: E·G/topk with --moe-router-pre-softmax, else G; the weights
  // take its cube root with a GLU or squared ReLU (three factors meet in the output), else its
  // square root (GeLU).
  double activation_scale = 1.0;
  double weight_scale = 1.0;
};

// The plan for `a` (--moe-use-upcycling on), or Megatron's assertion texts: the dense FFN size not
// divisible by the experts', --num-experts not divisible by the granularity, an activation other
// than gelu, silu (--swiglu) or squared_relu (--squared-relu). Also: --moe-upcycling-granularity
// below 1, and G > 1 with dense layers in the MoE model (they are the dense model's MLP size / G).
StatusOr<UpcyclingPlan> make_upcycling_plan(const Arguments& a);

// Where rows [first_row, first_row + rows) of one piece of MoE parameter `s` are read from: tensor
// `name` (empty: the parameter keeps its initial values: the router) of global shape
// `global_shape`, the box at `offsets` of those rows' shape, multiplied by `scale`.
struct UpcyclingSource {
  std::string name;
  Shape global_shape;
  std::vector<int64_t> offsets;
  float scale = 1.0f;
  int64_t first_row = 0, rows = 0;  // along dimension 0, relative to the piece
};
// `offsets`: the piece's offsets in `s`'s global tensor; `rows` its extent along dimension 0.
// Experts' linear_fc1/fc2 weights and biases map to their slice of the dense mlp.linear_fc1/fc2
// (decoder.layers.L.mlp.experts.local_experts.E.X -> decoder.layers.L.mlp.X), the router to
// nothing, everything else to itself. One source per piece, except an expert's GLU fc1 piece that
// spans both halves (no TP): one for its gate rows, one for its up rows.
std::vector<UpcyclingSource> upcycling_sources(const UpcyclingPlan& plan, const ParamSpec& s,
                                               const std::vector<int64_t>& offsets, int64_t rows);

// Whether `name` is a MoE router's weight (…mlp.router.weight), whose rows upcycle_router_rows ties.
bool is_router_weight(const std::string& name);
// Megatron's router initialisation for granularity G: row e of the [E, H] `router` becomes its
// initial row floor(e / G) (in place). G = 1 leaves it as it is.
void upcycle_router_rows(const UpcyclingPlan& plan, Tensor& router);

}  // namespace gale
