// Minimal NumPy .npy (format 1.0) files of 1-D/2-D little-endian integer arrays, so that cached
// dataset indices can be inspected with numpy.load.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"

namespace gale {

template <class T>
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<T> data;
};

// T is int16_t, int32_t or int64_t. Writes to "<path>.tmp.<pid>" and renames, so concurrent
// writers of the same file never expose a partial file.
template <class T>
Status save_npy(const std::string& path, const std::vector<T>& data, const std::vector<int64_t>& shape);

// Loads an array written by save_npy (or numpy.save of a C-order array of the same dtype).
// Any other dtype, order, or a truncated file is an error naming the file.
template <class T>
StatusOr<NpyArray<T>> load_npy(const std::string& path);

// A .npy file's array mapped read-only instead of copied (numpy.load(mmap_mode='r'), as Megatron
// loads cached indices): the checks of load_npy, then `data` points into the mapping that `file`
// keeps alive, so the pages are read on demand and are not counted as the process's own memory.
// An array whose start is not aligned for T (numpy pads the header to 64 bytes) is an error.
template <class T>
struct MappedNpy {
  std::shared_ptr<const MappedFile> file;
  std::vector<int64_t> shape;
  std::span<const T> data;
};
template <class T>
StatusOr<MappedNpy<T>> map_npy(const std::string& path);

// Parses .npy bytes (exposed for the fuzzer).
template <class T>
StatusOr<NpyArray<T>> parse_npy(const uint8_t* data, int64_t size, const std::string& name);

}  // namespace gale
