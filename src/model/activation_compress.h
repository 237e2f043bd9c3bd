// --compress-activation and --compress-dense: a transformer layer's activations kept for backward
// held losslessly compressed (core/plane_codec.h) from the end of its forward to the start of its
// backward.
//
// MindSpeed's CompressActivationFeature wraps the forward of the layers --compress-activation lists
// (1-based layer numbers, "1-3,5"; "0": every layer) and compresses the tensors autograd saves in
// them (their bf16/fp16 ones of at least 32768 elements: a limit of its NPU operator) with the
// Ascend lossless coder, decompressing them when the layer's backward starts. Its
// AnsCompressTensorFeature (--compress-dense level0|level1) compresses one tensor per dense MLP: the
// output of linear_fc1, the activation function's input; level0 codes the exponent byte and keeps
// the mantissa bytes raw in device memory, level1 also moves the raw mantissa to host memory.
//
// Gale, per micro-batch and layer (GPTModel::forward / backward):
// - --compress-activation: every tensor of the layer's LayerSaved (direct members, the attention's
//   qkv/lse/kv_global/head_out, MLA's, the shared expert's and the MoE layer's tensors: x, probs,
//   expert rows, per-expert fc1 outputs and activations, expert outputs) of at least
//   kMinCompressBytes, f32 and bf16 alike, all byte planes coded. Tensors sharing one storage are
//   compressed once and come back sharing one storage. (The router's and the ring's internals and
//   the index vectors stay as they are.)
// - --compress-dense level0: LayerSaved::fc1_out of every dense layer, plane 0 (sign and high
//   exponent bits) coded, the other planes kept raw in memory; level1: the raw planes also go to an
//   anonymous temporary file (core/swap_file.h, in $TMPDIR or /tmp: Gale's lower memory tier, as
//   --swap-attention's) and are read back in backward.
// The tensors come back bit for bit, so training is bit-identical. Compression runs on the calling
// thread, after the layer's forward; decompression before the layer's backward.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/plane_codec.h"
#include "core/status.h"
#include "core/swap_file.h"
#include "model/transformer_layer.h"

namespace gale {

// Tensors below this many bytes are left as they are (the codec's per-plane overhead).
constexpr int64_t kMinCompressBytes = 4096;

struct ActivationCompressConfig {
  std::vector<bool> layers;  // --compress-activation: by 0-based global layer number; empty = none
  int dense_level = -1;      // --compress-dense: -1 off (disable), 0 level0, 1 level1
  bool any() const;
  bool layer(int64_t global_layer) const {
    return global_layer >= 0 && global_layer < static_cast<int64_t>(layers.size()) &&
           layers[static_cast<size_t>(global_layer)];
  }
};

// --compress-activation's value: "0" (every layer) or comma-separated 1-based layer numbers and
// ranges a-b ("1-3,5"), each within [1, num_layers]; the result is per 0-based layer. An error
// names the flag and the offending item.
StatusOr<std::vector<bool>> parse_compress_activation(const std::string& spec, int64_t num_layers);
// --compress-dense's value: "disable" -1, "level0" 0, "level1" 1.
StatusOr<int> parse_compress_dense(const std::string& value);

// Bytes before and after compression, summed over what was compressed.
struct CompressStats {
  int64_t tensors = 0, raw_bytes = 0, stored_bytes = 0, file_bytes = 0;
  double encode_seconds = 0.0, decode_seconds = 0.0;
  void add(const CompressStats& o);
};

// One micro-batch's compressed activations.
class ActivationCompressor {
 public:
  explicit ActivationCompressor(const ActivationCompressConfig& c) : config_(c) {}

  // Compresses what the config selects of global layer `global_layer`'s `saved` (its slot
  // `layer`), releasing the originals.
  void compress(int64_t layer, int64_t global_layer, LayerSaved& saved);
  // Puts slot `layer`'s tensors back into `saved` (nothing for a layer not compressed).
  void decompress(int64_t layer, LayerSaved& saved);
  const CompressStats& stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<size_t> slots;  // positions in saved_tensors() sharing this storage
    std::vector<Shape> shapes;  // each slot's shape
    CompressedPlanes planes;
    DType dtype = DType::kF32;
    std::vector<int64_t> file_offsets;  // level1: the raw planes' offsets in file_ (-1: kept in memory)
  };
  // Writes the raw planes of `e` to the file (--compress-dense level1).
  void spill(Entry& e);
  void unspill(Entry& e);

  ActivationCompressConfig config_;
  std::map<int64_t, std::vector<Entry>> layers_;
  std::unique_ptr<SwapFile> file_;  // --compress-dense level1, created on first use
  CompressStats stats_;
};

// Every tensor of `saved` that --compress-activation considers, in a fixed order.
std::vector<Tensor*> saved_tensors(LayerSaved& saved);

}  // namespace gale
