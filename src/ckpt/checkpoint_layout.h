// Megatron's checkpoint directory conventions and the names of Gale's checkpoint files.
//
//   <save>/latest_checkpointed_iteration.txt   "100" (or "release"); written last, atomically
//   <save>/iter_0000100/                         one complete checkpoint (docs/formats/checkpoint.md)
//       metadata.json                            written last inside the directory
//       shard_00000.safetensors ...              one per writing rank
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace gale {

inline constexpr const char* kTrackerFileName = "latest_checkpointed_iteration.txt";
inline constexpr const char* kCheckpointMetadataFileName = "metadata.json";
inline constexpr const char* kCheckpointFormat = "gale-checkpoint";  // metadata.json "format"
inline constexpr int kCheckpointVersion = 1;                         // metadata.json "version"
inline constexpr const char* kReleaseDirName = "release";

// "iter_0000100" (7 digits, as Megatron).
std::string iteration_dir_name(int64_t iteration);
// "<save_dir>/iter_0000100".
std::string iteration_dir(const std::string& save_dir, int64_t iteration);
// "shard_00003.safetensors".
std::string shard_file_name(int rank);
std::string tracker_path(const std::string& save_dir);

// What the tracker file says: an iteration, or "release".
struct TrackerValue {
  int64_t iteration = 0;
  bool release = false;
};
// Reads <save_dir>/latest_checkpointed_iteration.txt. NotFound when there is none (no checkpoint
// saved yet); DataLoss when it holds anything but a non-negative integer or "release".
StatusOr<TrackerValue> read_tracker(const std::string& save_dir);
// Writes the tracker atomically (temporary file, fsync, rename, directory fsync).
Status write_tracker(const std::string& save_dir, int64_t iteration);

}  // namespace gale
