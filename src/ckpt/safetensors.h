// Hugging Face safetensors files: a validating, lazy mmap reader and an atomic writer.
//
// Format (docs/formats/safetensors.md): 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
// (padded with spaces), then the data buffer; offsets are relative to the buffer start, and the
// tensors tile the buffer exactly (no overlap, no hole, nothing after the last).
//
//   GALE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open("model.safetensors"));
//   for (const SafetensorsEntry& e : f.entries()) ...;          // names, dtypes, shapes: no data read
//   GALE_ASSIGN_OR_RETURN(Tensor w, f.read("embedding.word_embeddings.weight", DType::kF32));
//
//   SafetensorsWriter w;
//   GALE_RETURN_IF_ERROR(w.add("x", tensor));
//   w.set_metadata("format", "pt");
//   GALE_RETURN_IF_ERROR(w.write("out.safetensors").status());
//
// Every error names the file and, where it applies, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "ckpt/safetensors_dtype.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

// The Python package refuses headers larger than this; so does Gale.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  StDType dtype = StDType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte range [begin, end) in the data buffer
  uint64_t end = 0;
  int64_t numel() const { return shape_numel(shape); }
};

class SafetensorsFile {
 public:
  SafetensorsFile() = default;

  // Maps `path` and validates the whole header against the file size. NotFound when the file is
  // missing; DataLoss when it is truncated or corrupt, e.g.
  //   "model.safetensors: tensor 'x' data_offsets [0, 40) exceed the 32-byte buffer".
  static StatusOr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  const MappedFile& mapping() const { return *file_; }  // the whole file
  uint64_t file_size() const { return file_->size(); }
  uint64_t header_bytes() const { return header_bytes_; }  // N, the JSON header length
  // Entries in data order (ascending begin).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const;
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  // The "__metadata__" map (empty when the header has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The entry's bytes inside the mapping (little-endian, possibly unaligned); valid while this
  // object or a copy of it lives.
  const uint8_t* data(const SafetensorsEntry& entry) const;

  // Reads a tensor in the Gale dtype that holds it unchanged (F32, BF16, F64, I64, I32, U16, U8;
  // BOOL as u8). Other dtypes (F16, I16, ...) need the converting form. NotFound for a missing name.
  StatusOr<Tensor> read(std::string_view name) const;
  // Reads a tensor converted to `as` (e.g. F16 or BF16 or F64 -> f32), see convert_elements().
  StatusOr<Tensor> read(std::string_view name, DType as) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t header_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> entries_ position
  std::map<std::string, std::string> metadata_;
};

// What a write produced: the file size and its CRC-32 (zlib's), for checkpoint manifests.
struct SafetensorsWriteResult {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};

class SafetensorsWriter {
 public:
  // Adds a tensor under `name`, stored in its own dtype (st_dtype_of). The data is referenced, not
  // copied: the tensor must stay alive and unchanged until write(). InvalidArgument for an empty
  // or duplicate name, or the reserved name "__metadata__".
  Status add(const std::string& name, const Tensor& tensor);
  // Adds raw little-endian elements of any safetensors dtype (e.g. F16, I16, BOOL).
  Status add_raw(const std::string& name, StDType dtype, const Shape& shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

  // Writes the file atomically (<path>.tmp, fsync, rename, fsync of the directory), laid out as
  // the Python package does: tensors ordered by dtype (widest first, in StDType order) then name,
  // header JSON compact, "__metadata__" first, padded with spaces to a multiple of 8 bytes.
  StatusOr<SafetensorsWriteResult> write(const std::string& path) const;

  // The serialized header (length prefix excluded, padding included) that write() would produce.
  std::string header() const;

 private:
  struct Pending {
    std::string name;
    StDType dtype;
    Shape shape;
    const void* data;
    uint64_t bytes;
  };
  std::vector<const Pending*> ordered() const;
  std::vector<Pending> pending_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace gale
