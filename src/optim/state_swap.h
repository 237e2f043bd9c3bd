// --swap-optimizer's file tier and --compress-optimizer's compressed tier: the optimizer's fp32 state
// kept out of the working set (in an anonymous temporary file, or compressed in memory) and brought
// back one chunk at a time through a single staging buffer.
//
// MindSpeed's swap optimizer (SwapOptimizerFeature) keeps the Adam moments in host memory during
// forward and backward and, in the optimizer step, copies them to the device in
// --swap-optimizer-times chunks (H2D, fused AdamW, D2H). On a CPU the "device" and the "host" are
// the same RAM, so Gale's lower tier is a file, as DeepSpeed's NVMe offload: the state of every
// owned element lives in the file, and only one chunk of it is resident, in the staging buffer,
// while the step updates that chunk's elements.
//
// The file (core/swap_file.h) is created with mkstemp in a directory (--swap-optimizer-dir, default
// $TMPDIR or /tmp) and unlinked at once, so nothing is left behind, even after a crash; its blocks
// are reserved at creation (posix_fallocate where the file system supports it) so that a full disk
// is a start-up error, not a failure in the middle of training. Reads and writes are pread/pwrite
// of whole chunks. A directory on tmpfs keeps the state in RAM again (just outside the allocator's count):
// point the flag at a disk.
//
// Layout: state tensor k (0 ≤ k < num_states: exp_avg, exp_avg_sq for Adam; momentum_buffer for
// SGD) occupies bytes [4·k·numel, 4·(k+1)·numel) of the file, element i of the optimizer's packed
// state order (all buffers concatenated) at 4·(k·numel + i). A chunk [b_c, b_{c+1}) of that order
// is staged as num_states consecutive runs of max-chunk floats.
//
// --compress-optimizer (MindSpeed's CompressOptimizerFeature) uses the same chunk plan and staging
// buffer with no file: state k's part of chunk c is held as one lossless compressed block
// (core/plane_codec.h: byte planes + zstd) in memory. load(c) decompresses the chunk's blocks into
// the staging buffer and frees them; flush() compresses the staged values into new blocks. The
// blocks are u8 tensors, so the allocator counts exactly what the compressed state takes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/plane_codec.h"
#include "core/status.h"
#include "core/swap_file.h"
#include "core/tensor.h"

namespace gale {

// A run [begin, begin + numel) of the packed state order whose elements one kernel call updates
// together (a parameter's owned piece, Optimizer::Segment).
struct StateRun {
  int64_t begin = 0;
  int64_t numel = 0;
};

// The chunk boundaries b_0 = 0 < b_1 < ... < b_C = numel of `numel` state elements in at most
// `times` chunks (times ≤ 0 counts as 1: MindSpeed's --swap-optimizer-times 0 swaps all at once):
// boundary j aims at ⌈j·numel/times⌉ (chunks differ by at most one element), then, when it falls
// strictly inside a run, moves up to the next multiple of `align` elements from the run's start
// (or the run's end), so that every kernel call sees the same vector lanes as an unchunked step
// and the result is bit-identical. Boundaries that coincide are merged. numel = 0: {0}.
std::vector<int64_t> plan_swap_chunks(const std::vector<StateRun>& runs, int64_t numel, int64_t times,
                                      int64_t align = 64);

// The swapped optimizer state: the file, the chunk plan and the one staging buffer.
class OptimizerStateSwap {
 public:
  // `num_states` state tensors of `numel` elements each, split at `bounds` (plan_swap_chunks); the
  // file starts as zeros (the optimizer's initial state).
  static StatusOr<std::unique_ptr<OptimizerStateSwap>> create(const std::string& dir, int num_states, int64_t numel,
                                                              std::vector<int64_t> bounds);
  // --compress-optimizer: the same, the chunks held compressed in memory instead of in a file.
  static std::unique_ptr<OptimizerStateSwap> create_compressed(int num_states, int64_t numel,
                                                               std::vector<int64_t> bounds);
  bool compressed() const { return !file_; }

  int num_chunks() const { return static_cast<int>(bounds_.size()) - 1; }
  const std::vector<int64_t>& bounds() const { return bounds_; }
  // The chunk holding state element `index`.
  int chunk_of(int64_t index) const;
  // Makes chunk `c` resident in the staging buffer, first writing back the one resident (a no-op
  // when `c` already is). IO errors stop the job (GALE_CHECK naming the file).
  void load(int c);
  // Writes back the resident chunk; none is resident afterwards.
  void flush();
  int resident() const { return resident_; }
  // Element `index` of state `k`, inside the resident chunk.
  float* at(int k, int64_t index) {
    return staging_.data<float>() + static_cast<int64_t>(k) * max_chunk_ + (index - bounds_[resident_]);
  }
  // Elements [begin, begin + n) of state `k`, straight from / to the file (checkpoints); nothing
  // may be resident.
  Status read(int k, int64_t begin, int64_t n, float* out) const;
  Status write(int k, int64_t begin, int64_t n, const float* in);

  int num_states() const { return num_states_; }
  int64_t numel() const { return numel_; }
  int64_t staging_bytes() const { return static_cast<int64_t>(staging_.defined() ? staging_.nbytes() : 0); }
  int64_t file_bytes() const { return file_ ? file_->size() : 0; }
  const std::string& path() const { return file_->path(); }
  // --compress-optimizer: bytes of the compressed blocks (the chunk in the staging buffer, if any,
  // has none), and what the same state takes uncompressed (num_states · numel · 4).
  int64_t compressed_bytes() const;
  int64_t raw_bytes() const { return static_cast<int64_t>(num_states_) * numel_ * 4; }
  // Bytes this state holds in memory: the staging buffer and the compressed blocks.
  int64_t resident_bytes() const { return staging_bytes() + compressed_bytes(); }
  // --compress-optimizer: seconds spent compressing and decompressing chunks so far.
  double encode_seconds() const { return encode_seconds_; }
  double decode_seconds() const { return decode_seconds_; }

 private:
  OptimizerStateSwap() = default;
  int64_t file_offset(int k, int64_t index) const { return (static_cast<int64_t>(k) * numel_ + index) * 4; }
  // Moves chunk `c` between the file (or its compressed blocks) and the staging buffer.
  Status transfer(int c, bool to_file);
  // --compress-optimizer: the block of state k, chunk c.
  CompressedPlanes& block(int k, int c) { return blocks_[static_cast<size_t>(k * num_chunks() + c)]; }
  const CompressedPlanes& block(int k, int c) const { return blocks_[static_cast<size_t>(k * num_chunks() + c)]; }

  std::unique_ptr<SwapFile> file_;  // null with --compress-optimizer
  std::vector<CompressedPlanes> blocks_;  // --compress-optimizer: [num_states · num_chunks]
  int num_states_ = 0;
  int64_t numel_ = 0;
  std::vector<int64_t> bounds_;
  int64_t max_chunk_ = 0;
  Tensor staging_;  // [num_states · max_chunk] floats
  int resident_ = -1;
  double encode_seconds_ = 0.0, decode_seconds_ = 0.0;
};

}  // namespace gale
