// Indexed-dataset and mock token sources.
#include "data/token_source.h"

#include <mutex>

#include "data/numpy_random.h"

namespace gale {

namespace {

class IndexedSource : public TokenSource {
 public:
  explicit IndexedSource(std::unique_ptr<IndexedDataset> ds) : ds_(std::move(ds)) {}
  const std::string& name() const override { return ds_->prefix(); }
  int64_t num_sequences() const override { return ds_->num_sequences(); }
  const UnalignedArray<int32_t>& sequence_lengths() const override { return ds_->sequence_lengths(); }
  Status read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override {
    return ds_->read(seq, offset, length, out);
  }
  // Computed on first use (only --data-cache-path needs it): counts plus FNV-1a over the
  // sequence lengths, so a rewritten dataset never reuses stale cached indices.
  std::string fingerprint() const override {
    std::call_once(fingerprint_once_, [this] {
      uint64_t h = 0xcbf29ce484222325ull;
      const auto& lens = ds_->sequence_lengths();
      for (int64_t i = 0; i < lens.size(); ++i) {
        h ^= static_cast<uint32_t>(lens[i]);
        h *= 0x100000001b3ull;
      }
      fingerprint_ =
          str_cat("sequences=", ds_->num_sequences(), " documents=", ds_->num_documents(),
                  " tokens=", ds_->total_tokens(), " dtype=", token_dtype_name(ds_->dtype()), " lengths-fnv=", h);
    });
    return fingerprint_;
  }

 private:
  std::unique_ptr<IndexedDataset> ds_;
  mutable std::once_flag fingerprint_once_;
  mutable std::string fingerprint_;
};

class MockSource : public TokenSource {
 public:
  explicit MockSource(int32_t eod) : eod_(eod) {
    lengths_ = NumpyDefaultRng(0).integers_int32(1, kMockMaxLength, kMockDocuments);
    view_ = UnalignedArray<int32_t>(lengths_.data(), static_cast<int64_t>(lengths_.size()));
  }
  const std::string& name() const override { return name_; }
  int64_t num_sequences() const override { return kMockDocuments; }
  const UnalignedArray<int32_t>& sequence_lengths() const override { return view_; }
  Status read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override {
    if (seq < 0 || seq >= kMockDocuments) return OutOfRange("mock: sequence ", seq, " out of range");
    int64_t len = lengths_[static_cast<size_t>(seq)];
    if (offset < 0 || length < 0 || offset + length > len)
      return OutOfRange("mock: tokens [", offset, ", ", offset + length, ") of a sequence of length ", len);
    for (int64_t i = 0; i < length; ++i) {
      int64_t pos = offset + i;
      out[i] = pos == len - 1 ? eod_ : static_cast<int32_t>(pos + 1);
    }
    return Status::Ok();
  }
  std::string fingerprint() const override { return "mock"; }

 private:
  std::string name_ = "mock";
  int32_t eod_;
  std::vector<int32_t> lengths_;
  UnalignedArray<int32_t> view_;
};

}  // namespace

StatusOr<std::shared_ptr<TokenSource>> open_indexed_source(const std::string& prefix, bool mmap_bin) {
  GALE_ASSIGN_OR_RETURN(auto ds, IndexedDataset::open(prefix, mmap_bin));
  return make_indexed_source(std::move(ds));
}

std::shared_ptr<TokenSource> make_indexed_source(std::unique_ptr<IndexedDataset> dataset) {
  return std::make_shared<IndexedSource>(std::move(dataset));
}

std::shared_ptr<TokenSource> make_mock_source(int32_t eod) { return std::make_shared<MockSource>(eod); }

}  // namespace gale
