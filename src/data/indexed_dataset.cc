// Megatron .bin/.idx reader and writer.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <limits>

namespace gale {

bool valid_token_dtype_code(uint8_t code) { return code >= 1 && code <= 8; }

int token_dtype_size(TokenDType t) {
  switch (t) {
    case TokenDType::kUInt8:
      return 1;
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kInt16:
      return 2;
    case TokenDType::kInt32:
      return 4;
    case TokenDType::kInt64:
      return 8;
    case TokenDType::kFloat64:
      return 8;
    case TokenDType::kFloat32:
      return 4;
    case TokenDType::kUInt16:
      return 2;
  }
  return 0;
}

const char* token_dtype_name(TokenDType t) {
  switch (t) {
    case TokenDType::kUInt8:
      return "uint8";
    case TokenDType::kInt8:
      return "int8";
    case TokenDType::kInt16:
      return "int16";
    case TokenDType::kInt32:
      return "int32";
    case TokenDType::kInt64:
      return "int64";
    case TokenDType::kFloat64:
      return "float64";
    case TokenDType::kFloat32:
      return "float32";
    case TokenDType::kUInt16:
      return "uint16";
  }
  return "?";
}

TokenDType optimal_token_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

std::string idx_path(const std::string& prefix) { return prefix + ".idx"; }
std::string bin_path(const std::string& prefix) { return prefix + ".bin"; }

StatusOr<IndexView> IndexView::parse(const uint8_t* data, int64_t size, const std::string& name) {
  if (size < kIndexHeaderBytes)
    return DataLoss(name, ": expected at least ", kIndexHeaderBytes, " bytes of MMIDIDX header, found ", size,
                    " bytes");
  if (std::memcmp(data, kIndexMagic, sizeof kIndexMagic) != 0)
    return DataLoss(name, ": not a Megatron indexed-dataset index (expected magic \"MMIDIDX\\0\\0\")");
  uint64_t version = load_unaligned<uint64_t>(data + 9);
  if (version != 1) return DataLoss(name, ": expected MMIDIDX version 1, found version ", version);
  uint8_t code = data[17];
  if (!valid_token_dtype_code(code))
    return DataLoss(name, ": expected a dtype code in 1..8 at byte 17, found ", static_cast<int>(code));
  uint64_t s = load_unaligned<uint64_t>(data + 18);
  uint64_t d = load_unaligned<uint64_t>(data + 26);
  constexpr uint64_t kMaxCount = uint64_t{1} << 40;
  if (s >= kMaxCount || d >= kMaxCount)
    return DataLoss(name, ": implausible header (sequence_count ", s, ", document_count ", d, ")");
  IndexView v;
  v.dtype = static_cast<TokenDType>(code);
  v.sequence_count = static_cast<int64_t>(s);
  v.document_count = static_cast<int64_t>(d);
  int64_t expected = kIndexHeaderBytes + 12 * v.sequence_count + 8 * v.document_count;
  if (size == expected + v.sequence_count && v.sequence_count > 0)
    return Unimplemented(name, ": multimodal indexed datasets (with sequence_modes) are not supported");
  if (size != expected)
    return DataLoss(name, ": expected ", expected, " bytes for ", s, " sequences and ", d, " document entries, found ",
                    size, " bytes (truncated or corrupt)");
  if (v.document_count < 1) return DataLoss(name, ": document_count is 0 (expected at least the leading 0 entry)");
  const uint8_t* p = data + kIndexHeaderBytes;
  v.sequence_lengths = UnalignedArray<int32_t>(p, v.sequence_count);
  v.sequence_pointers = UnalignedArray<int64_t>(p + 4 * v.sequence_count, v.sequence_count);
  v.document_indices = UnalignedArray<int64_t>(p + 12 * v.sequence_count, v.document_count);
  if (v.document_indices[0] != 0)
    return DataLoss(name, ": document_indices[0] is ", v.document_indices[0], ", expected 0");
  for (int64_t k = 1; k < v.document_count; ++k) {
    int64_t a = v.document_indices[k - 1], b = v.document_indices[k];
    if (b < a || b > v.sequence_count)
      return DataLoss(name, ": document_indices[", k, "] = ", b, " is out of order or past sequence_count ",
                      v.sequence_count);
  }
  if (v.document_indices[v.document_count - 1] != v.sequence_count)
    return DataLoss(name, ": last document index is ", v.document_indices[v.document_count - 1],
                    ", expected sequence_count ", v.sequence_count);
  int64_t item = token_dtype_size(v.dtype);
  int64_t offset = 0;
  for (int64_t i = 0; i < v.sequence_count; ++i) {
    int32_t len = v.sequence_lengths[i];
    if (len < 0) return DataLoss(name, ": sequence ", i, " has negative length ", len);
    if (v.sequence_pointers[i] != offset)
      return DataLoss(name, ": sequence ", i, " starts at byte ", v.sequence_pointers[i], ", expected ", offset,
                      " (pointers must follow the lengths)");
    offset += static_cast<int64_t>(len) * item;
  }
  v.bin_bytes = offset;
  return v;
}

IndexedDataset::~IndexedDataset() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
}

StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::open(const std::string& prefix, bool mmap_bin) {
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  GALE_ASSIGN_OR_RETURN(ds->idx_, MappedFile::open(idx_path(prefix)));
  GALE_ASSIGN_OR_RETURN(ds->index_, IndexView::parse(ds->idx_->data(), ds->idx_->size(), idx_path(prefix)));
  int64_t bin_size = 0;
  if (mmap_bin) {
    GALE_ASSIGN_OR_RETURN(ds->bin_, MappedFile::open(bin_path(prefix)));
    bin_size = ds->bin_->size();
  } else {
    ds->bin_fd_ = ::open(bin_path(prefix).c_str(), O_RDONLY | O_CLOEXEC);
    if (ds->bin_fd_ < 0) {
      if (errno == ENOENT) return NotFound(bin_path(prefix), ": no such file");
      return IOError(bin_path(prefix), ": cannot open (", std::strerror(errno), ")");
    }
    off_t end = ::lseek(ds->bin_fd_, 0, SEEK_END);
    if (end < 0) return IOError(bin_path(prefix), ": cannot determine size");
    bin_size = end;
  }
  if (bin_size != ds->index_.bin_bytes)
    return DataLoss(bin_path(prefix), ": expected ", ds->index_.bin_bytes, " bytes (", ds->index_.sequence_count,
                    " sequences of ", token_dtype_name(ds->index_.dtype), " as ", idx_path(prefix), " says), found ",
                    bin_size, " bytes", bin_size < ds->index_.bin_bytes ? " (truncated)" : "");
  return ds;
}

int64_t IndexedDataset::total_tokens() const { return index_.bin_bytes / token_dtype_size(index_.dtype); }

namespace {
template <class T>
Status convert_tokens(const uint8_t* src, int64_t n, int32_t* out, const std::string& name) {
  for (int64_t i = 0; i < n; ++i) {
    T v = load_unaligned<T>(src + i * static_cast<int64_t>(sizeof(T)));
    if constexpr (std::is_floating_point_v<T>) {
      if (!(v >= 0 && v <= static_cast<T>(std::numeric_limits<int32_t>::max())) ||
          v != static_cast<T>(static_cast<int64_t>(v)))
        return DataLoss(name, ": token value ", v, " is not a token id");
    } else if constexpr (sizeof(T) == 8) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        return DataLoss(name, ": token value ", v, " does not fit int32");
    }
    out[i] = static_cast<int32_t>(v);
  }
  return Status::Ok();
}
}  // namespace

Status IndexedDataset::read(int64_t seq, int64_t offset, int64_t length, int32_t* out) const {
  if (seq < 0 || seq >= index_.sequence_count)
    return OutOfRange(prefix_, ": sequence ", seq, " out of range [0, ", index_.sequence_count, ")");
  int64_t len = index_.sequence_lengths[seq];
  if (offset < 0 || length < 0 || offset + length > len)
    return OutOfRange(prefix_, ": tokens [", offset, ", ", offset + length, ") of sequence ", seq, " of length ", len);
  if (length == 0) return Status::Ok();
  int64_t item = token_dtype_size(index_.dtype);
  int64_t begin = index_.sequence_pointers[seq] + offset * item;
  int64_t bytes = length * item;
  const uint8_t* src = nullptr;
  std::vector<uint8_t> tmp;
  if (bin_) {
    src = bin_->data() + begin;
  } else {
    tmp.resize(static_cast<size_t>(bytes));
    int64_t done = 0;
    while (done < bytes) {
      ssize_t n = ::pread(bin_fd_, tmp.data() + done, static_cast<size_t>(bytes - done), begin + done);
      if (n <= 0) return IOError(bin_path(prefix_), ": read failed at byte ", begin + done);
      done += n;
    }
    src = tmp.data();
  }
  const std::string& name = prefix_;
  switch (index_.dtype) {
    case TokenDType::kUInt8:
      return convert_tokens<uint8_t>(src, length, out, name);
    case TokenDType::kInt8:
      return convert_tokens<int8_t>(src, length, out, name);
    case TokenDType::kInt16:
      return convert_tokens<int16_t>(src, length, out, name);
    case TokenDType::kInt32:
      return convert_tokens<int32_t>(src, length, out, name);
    case TokenDType::kInt64:
      return convert_tokens<int64_t>(src, length, out, name);
    case TokenDType::kFloat64:
      return convert_tokens<double>(src, length, out, name);
    case TokenDType::kFloat32:
      return convert_tokens<float>(src, length, out, name);
    case TokenDType::kUInt16:
      return convert_tokens<uint16_t>(src, length, out, name);
  }
  return Internal("unknown dtype");
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {
constexpr size_t kWriteBuffer = 1 << 20;

template <class T>
Status append_tokens(std::span<const int32_t> tokens, std::vector<uint8_t>* buf, TokenDType dtype) {
  size_t start = buf->size();
  buf->resize(start + tokens.size() * sizeof(T));
  uint8_t* dst = buf->data() + start;
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t v = tokens[i];
    if (v < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        v > static_cast<int64_t>(std::numeric_limits<T>::max())) {
      buf->resize(start);
      return InvalidArgument("token id ", v, " does not fit the dataset dtype ", token_dtype_name(dtype));
    }
    T t = static_cast<T>(v);
    std::memcpy(dst + i * sizeof(T), &t, sizeof(T));
  }
  return Status::Ok();
}

Status write_all(std::FILE* f, const void* data, size_t bytes, const std::string& path) {
  if (bytes && std::fwrite(data, 1, bytes, f) != bytes)
    return IOError(path, ": write failed (", std::strerror(errno), ")");
  return Status::Ok();
}
}  // namespace

StatusOr<std::unique_ptr<IndexedDatasetWriter>> IndexedDatasetWriter::create(const std::string& prefix,
                                                                             TokenDType dtype) {
  std::unique_ptr<IndexedDatasetWriter> w(new IndexedDatasetWriter());
  w->prefix_ = prefix;
  w->dtype_ = dtype;
  std::string tmp = bin_path(prefix) + ".tmp";
  w->bin_ = std::fopen(tmp.c_str(), "wb");
  if (!w->bin_) return IOError(tmp, ": cannot create (", std::strerror(errno), ")");
  w->buffer_.reserve(kWriteBuffer + 4096);
  return w;
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (!finalized_) {
    std::remove((bin_path(prefix_) + ".tmp").c_str());
    std::remove((idx_path(prefix_) + ".tmp").c_str());
  }
}

Status IndexedDatasetWriter::flush_buffer() {
  Status s = write_all(bin_, buffer_.data(), buffer_.size(), bin_path(prefix_) + ".tmp");
  buffer_.clear();
  return s;
}

Status IndexedDatasetWriter::write_bin(const void* data, size_t bytes) {
  GALE_RETURN_IF_ERROR(flush_buffer());
  return write_all(bin_, data, bytes, bin_path(prefix_) + ".tmp");
}

Status IndexedDatasetWriter::add_document(std::span<const int32_t> tokens, std::span<const int32_t> lengths) {
  if (finalized_) return FailedPrecondition(prefix_, ": add_document after finalize");
  int64_t sum = 0;
  for (int32_t l : lengths) {
    if (l < 0) return InvalidArgument(prefix_, ": negative sequence length ", l);
    sum += l;
  }
  if (sum != static_cast<int64_t>(tokens.size()))
    return InvalidArgument(prefix_, ": sequence lengths add up to ", sum, " but the document has ", tokens.size(),
                           " tokens");
  Status s;
  switch (dtype_) {
    case TokenDType::kUInt8:
      s = append_tokens<uint8_t>(tokens, &buffer_, dtype_);
      break;
    case TokenDType::kInt8:
      s = append_tokens<int8_t>(tokens, &buffer_, dtype_);
      break;
    case TokenDType::kInt16:
      s = append_tokens<int16_t>(tokens, &buffer_, dtype_);
      break;
    case TokenDType::kInt32:
      s = append_tokens<int32_t>(tokens, &buffer_, dtype_);
      break;
    case TokenDType::kInt64:
      s = append_tokens<int64_t>(tokens, &buffer_, dtype_);
      break;
    case TokenDType::kUInt16:
      s = append_tokens<uint16_t>(tokens, &buffer_, dtype_);
      break;
    case TokenDType::kFloat32:
    case TokenDType::kFloat64:
      return Unimplemented(prefix_, ": writing ", token_dtype_name(dtype_), " token datasets");
  }
  GALE_RETURN_IF_ERROR(s);
  lengths_.insert(lengths_.end(), lengths.begin(), lengths.end());
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
  if (buffer_.size() >= kWriteBuffer) GALE_RETURN_IF_ERROR(flush_buffer());
  return Status::Ok();
}

Status IndexedDatasetWriter::add_index(const std::string& other_prefix) {
  if (finalized_) return FailedPrecondition(prefix_, ": add_index after finalize");
  GALE_ASSIGN_OR_RETURN(auto other, IndexedDataset::open(other_prefix));
  if (other->dtype() != dtype_)
    return InvalidArgument(other_prefix, ": dtype ", token_dtype_name(other->dtype()),
                           " differs from the output dtype ", token_dtype_name(dtype_));
  int64_t offset = static_cast<int64_t>(lengths_.size());
  const auto& lens = other->sequence_lengths();
  for (int64_t i = 0; i < lens.size(); ++i) lengths_.push_back(lens[i]);
  const auto& docs = other->document_indices();
  for (int64_t k = 1; k < docs.size(); ++k) doc_indices_.push_back(docs[k] + offset);
  GALE_ASSIGN_OR_RETURN(auto bin, MappedFile::open(bin_path(other_prefix)));
  return write_bin(bin->data(), static_cast<size_t>(bin->size()));
}

Status IndexedDatasetWriter::finalize() {
  if (finalized_) return FailedPrecondition(prefix_, ": finalize called twice");
  GALE_RETURN_IF_ERROR(flush_buffer());
  std::string bin_tmp = bin_path(prefix_) + ".tmp", idx_tmp = idx_path(prefix_) + ".tmp";
  if (std::fclose(bin_) != 0) {
    bin_ = nullptr;
    return IOError(bin_tmp, ": close failed (", std::strerror(errno), ")");
  }
  bin_ = nullptr;
  std::FILE* f = std::fopen(idx_tmp.c_str(), "wb");
  if (!f) return IOError(idx_tmp, ": cannot create (", std::strerror(errno), ")");
  std::vector<uint8_t> out;
  int64_t s = static_cast<int64_t>(lengths_.size()), d = static_cast<int64_t>(doc_indices_.size());
  out.reserve(static_cast<size_t>(kIndexHeaderBytes + 12 * s + 8 * d));
  auto put = [&out](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  put(kIndexMagic, sizeof kIndexMagic);
  uint64_t version = 1;
  put(&version, 8);
  uint8_t code = static_cast<uint8_t>(dtype_);
  put(&code, 1);
  uint64_t su = static_cast<uint64_t>(s), du = static_cast<uint64_t>(d);
  put(&su, 8);
  put(&du, 8);
  put(lengths_.data(), lengths_.size() * 4);
  int64_t item = token_dtype_size(dtype_), ptr = 0;
  for (int32_t len : lengths_) {
    put(&ptr, 8);
    ptr += static_cast<int64_t>(len) * item;
  }
  put(doc_indices_.data(), doc_indices_.size() * 8);
  Status st = write_all(f, out.data(), out.size(), idx_tmp);
  if (std::fclose(f) != 0 && st.ok()) st = IOError(idx_tmp, ": close failed");
  GALE_RETURN_IF_ERROR(st);
  if (std::rename(bin_tmp.c_str(), bin_path(prefix_).c_str()) != 0)
    return IOError(bin_path(prefix_), ": cannot move into place (", std::strerror(errno), ")");
  if (std::rename(idx_tmp.c_str(), idx_path(prefix_).c_str()) != 0)
    return IOError(idx_path(prefix_), ": cannot move into place (", std::strerror(errno), ")");
  finalized_ = true;
  return Status::Ok();
}

}  // namespace gale
