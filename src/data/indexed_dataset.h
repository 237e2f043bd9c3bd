// Megatron's indexed dataset (`PREFIX.bin` + `PREFIX.idx`, "MMIDIDX" version 1): reader and writer.
//
// The layout is in docs/formats/indexed-dataset.md. The writer produces the same bytes as
// Megatron's IndexedDatasetBuilder for the same tokens; the reader memory-maps both files, reads
// the unaligned arrays with memcpy, and validates everything it relies on when opening, so a
// truncated or foreign file is a clear error and never a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/mapped_file.h"

namespace gale {

// Megatron's DType codes (the byte at offset 17 of the .idx).
enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

bool valid_token_dtype_code(uint8_t code);
int token_dtype_size(TokenDType t);
const char* token_dtype_name(TokenDType t);  // numpy spelling: "uint16", "int32", ...
// Megatron's DType.optimal_dtype: uint16 when vocab_size < 65500, otherwise int32.
TokenDType optimal_token_dtype(int64_t vocab_size);

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kIndexHeaderBytes = 34;

std::string idx_path(const std::string& prefix);  // PREFIX.idx
std::string bin_path(const std::string& prefix);  // PREFIX.bin

// The parsed .idx: a view into a byte buffer that must outlive it. `parse` checks the magic,
// version, dtype code, the exact file size, that document_indices starts at 0, never decreases
// and ends at sequence_count, that lengths are non-negative and that every pointer equals the
// running sum of the previous lengths (so sequences tile the .bin exactly).
struct IndexView {
  TokenDType dtype = TokenDType::kInt32;
  int64_t sequence_count = 0;  // S
  int64_t document_count = 0;  // D = documents + 1
  UnalignedArray<int32_t> sequence_lengths;
  UnalignedArray<int64_t> sequence_pointers;
  UnalignedArray<int64_t> document_indices;
  int64_t bin_bytes = 0;  // the .bin size these pointers require

  // `name` is used in error messages (the file path).
  static StatusOr<IndexView> parse(const uint8_t* data, int64_t size, const std::string& name);
};

class IndexedDataset {
 public:
  // Opens PREFIX.idx and PREFIX.bin. `mmap_bin` false reads tokens with pread instead of mapping
  // the .bin (Megatron's --no-mmap-bin-files).
  static StatusOr<std::unique_ptr<IndexedDataset>> open(const std::string& prefix, bool mmap_bin = true);
  ~IndexedDataset();

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return index_.dtype; }
  int64_t num_sequences() const { return index_.sequence_count; }
  int64_t num_documents() const { return index_.document_count - 1; }
  const UnalignedArray<int32_t>& sequence_lengths() const { return index_.sequence_lengths; }
  const UnalignedArray<int64_t>& document_indices() const { return index_.document_indices; }
  int64_t sequence_pointer(int64_t i) const { return index_.sequence_pointers[i]; }
  int64_t total_tokens() const;

  // Copies tokens [offset, offset + length) of sequence `seq` into out[0..length) as int32.
  // Errors (not checks) on an out-of-range request, an I/O failure, or a token value that does
  // not fit int32 (int64/float datasets).
  Status read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const;

 private:
  IndexedDataset() = default;
  std::string prefix_;
  std::unique_ptr<MappedFile> idx_;
  std::unique_ptr<MappedFile> bin_;  // null when reading with pread
  int bin_fd_ = -1;
  IndexView index_;
};

// Writes PREFIX.bin while documents are added and PREFIX.idx on finalize, exactly as Megatron's
// IndexedDatasetBuilder. Output goes to "<path>.tmp" files that are renamed into place by
// finalize(), so an interrupted run never leaves a valid-looking half dataset; the temporary
// files are removed if the writer is destroyed before finalize().
class IndexedDatasetWriter {
 public:
  static StatusOr<std::unique_ptr<IndexedDatasetWriter>> create(const std::string& prefix, TokenDType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document made of sequences with the given lengths (sum(lengths) == tokens.size()). An
  // empty document (no sequences) repeats the last document index, as in Megatron. Fails when a
  // token does not fit the dtype.
  Status add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths);
  // Appends another finished dataset (same dtype): its lengths, its document boundaries shifted
  // by our sequence count, and its .bin bytes (Megatron's add_index, used to merge).
  Status add_index(const std::string& other_prefix);
  // Writes the .idx and moves both files into place.
  Status finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_indices_.size()) - 1; }
  TokenDType dtype() const { return dtype_; }

 private:
  IndexedDatasetWriter() = default;
  Status write_bin(const void* data, size_t bytes);
  Status flush_buffer();

  std::string prefix_;
  TokenDType dtype_ = TokenDType::kInt32;
  std::FILE* bin_ = nullptr;
  std::vector<uint8_t> buffer_;  // pending .bin bytes
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
  bool finalized_ = false;
};

}  // namespace gale
