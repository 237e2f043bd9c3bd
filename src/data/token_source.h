// The "low-level datasets" a GPT dataset draws tokens from: an indexed dataset on disk, or
// Megatron's MockGPTLowLevelDataset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"
#include "core/mapped_file.h"

namespace gale {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual const std::string& name() const = 0;  // the prefix, or "mock"
  virtual int64_t num_sequences() const = 0;
  virtual const UnalignedArray<int32_t>& sequence_lengths() const = 0;
  // Tokens [offset, offset + length) of sequence `seq` as int32 (thread-safe).
  virtual Status read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const = 0;
  // Identifies the content for the index cache (e.g. sequence count and .idx size).
  virtual std::string fingerprint() const = 0;
};

StatusOr<std::shared_ptr<TokenSource>> open_indexed_source(const std::string& prefix, bool mmap_bin = true);
// The token source over an indexed dataset already open.
std::shared_ptr<TokenSource> make_indexed_source(std::unique_ptr<IndexedDataset> dataset);

// MockGPTLowLevelDataset: 100000 documents with lengths from
// numpy.random.default_rng(0).integers(1, 4096, size=100000, dtype=int32); document i is
// [1, 2, ..., len_i - 1, eod].
inline constexpr int64_t kMockDocuments = 100000;
inline constexpr int32_t kMockMaxLength = 4096;
std::shared_ptr<TokenSource> make_mock_source(int32_t eod);

}  // namespace gale
