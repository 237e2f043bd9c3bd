// Reading a Gale checkpoint at any parallel layout: metadata, and any box of any saved tensor.
//
//   GALE_ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::open(args.load));   // follows the tracker
//   int64_t it = r.iteration();
//   GALE_ASSIGN_OR_RETURN(nlohmann::json sched, r.section("scheduler"));
//   // This rank's TP shard of the embedding, whatever layout the checkpoint was saved with:
//   GALE_ASSIGN_OR_RETURN(Tensor w, r.read_slice("embedding.word_embeddings.weight", {V, H}, {rank * V / tp, 0}, {V /
//   tp, H}));
//
// A slice is assembled from every saved piece that overlaps it. Errors name the tensor and the
// file: a missing tensor (NotFound), a global shape other than the one the model expects
// (FailedPrecondition), a slice the pieces do not fully cover, a truncated or corrupt shard (DataLoss),
// and a directory without metadata.json, i.e. a save that never finished (FailedPrecondition).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "ckpt/tensor_box.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

struct CheckpointReaderOptions {
  // Check each shard's CRC-32 against metadata.json the first time data is read from it
  // (sizes are always checked when the checkpoint is opened).
  bool verify_checksums = true;
};

class CheckpointReader {
 public:
  // Follows <load_dir>/latest_checkpointed_iteration.txt (an iteration or "release").
  static StatusOr<CheckpointReader> open(const std::string& load_dir, CheckpointReaderOptions options = {});
  // <load_dir>/iter_XXXXXXX, whatever the tracker says.
  static StatusOr<CheckpointReader> open_iteration(const std::string& load_dir, int64_t iteration,
                                                   CheckpointReaderOptions options = {});
  // One checkpoint directory (iter_XXXXXXX or release).
  static StatusOr<CheckpointReader> open_directory(const std::string& dir, CheckpointReaderOptions options = {});

  const std::string& directory() const { return state_->dir; }
  int64_t iteration() const { return state_->iteration; }
  // metadata.json as written (format, version, iteration, world_size, shards, and the trainer's sections).
  const nlohmann::json& metadata() const { return state_->metadata; }
  // One trainer section of metadata.json; NotFound naming the file when absent.
  StatusOr<nlohmann::json> section(const std::string& key) const;

  std::vector<std::string> tensor_names() const;  // sorted
  bool has_tensor(const std::string& name) const;
  // The global shape the tensor was saved with; NotFound when absent.
  StatusOr<Shape> global_shape(const std::string& name) const;

  // The box [offsets, offsets + shape) of tensor `name`, converted to `dtype`. `expected_global_shape`
  // is the shape the model has for it: a checkpoint saved with another shape is an error.
  StatusOr<Tensor> read_slice(const std::string& name, const Shape& expected_global_shape,
                              const std::vector<int64_t>& offsets, const Shape& shape, DType dtype = DType::kF32) const;
  // The same into an existing tensor whose shape is the slice's (f32, bf16, f64 or an integer dtype).
  Status read_slice_into(const std::string& name, const Shape& expected_global_shape,
                         const std::vector<int64_t>& offsets, Tensor& out) const;
  // The whole tensor.
  StatusOr<Tensor> read(const std::string& name, const Shape& expected_global_shape, DType dtype = DType::kF32) const;
  // Elements [start, start + length) of a flattened 1-D tensor of `expected_numel` elements.
  StatusOr<Tensor> read_flat(const std::string& name, int64_t expected_numel, int64_t start, int64_t length,
                             DType dtype = DType::kF32) const;

 private:
  struct PieceRef {
    int shard;
    const SafetensorsEntry* entry;
    Box box;
  };
  struct TensorInfo {
    Shape global_shape;
    std::vector<PieceRef> pieces;
  };
  struct State {
    std::string dir;
    int64_t iteration = 0;
    nlohmann::json metadata;
    CheckpointReaderOptions options;
    std::vector<SafetensorsFile> shards;
    std::vector<uint32_t> shard_crc;
    std::vector<int8_t> shard_verified;  // guarded by mutex
    std::mutex mutex;
    std::map<std::string, TensorInfo> tensors;
  };
  Status verify_shard(int shard) const;
  StatusOr<const TensorInfo*> lookup(const std::string& name, const Shape& expected_global_shape) const;

  std::shared_ptr<State> state_;
};

}  // namespace gale
