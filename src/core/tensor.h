// Contiguous n-d tensors (f32, bf16, integer) over reference-counted storage from the allocator.
//
// A Tensor is a shape + dtype + pointer into a Storage. Tensors are always contiguous and
// row-major; `view` reshapes, `slice` takes a contiguous range of the first dimension. Copies of
// a Tensor share storage (like a shared_ptr). Kernels take raw pointers and sizes; Tensors are
// how layers own, pass and account memory.
//
// Dimension glossary, used in shape comments everywhere ("// [S, B, H]"):
//   B  micro-batch size            S  sequence length       H  hidden size
//   NH attention (query) heads     KV key/value heads (= query groups)
//   HD head dim (kv_channels)      F  FFN hidden size       V  (padded) vocabulary size
//   L  transformer layers          E  experts
// Activations are laid out [S, B, H] as in Megatron, so a sequence-parallel split is a contiguous
// slice of the first dimension and a context-parallel rank's share is two (parallel/context_split.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace gale {

using Shape = std::vector<int64_t>;

std::string shape_string(const Shape& shape);  // "[4, 2, 8]"
int64_t shape_numel(const Shape& shape);

// Owned bytes from host_allocator(); freed (and uncounted) when the last Tensor goes.
class Storage {
 public:
  explicit Storage(size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Tensor::zero streams (non-temporal stores) from this many bytes on.
constexpr int64_t kStreamingZeroBytes = int64_t{16} << 20;

class Tensor {
 public:
  Tensor() = default;

  // New storage, uninitialised / zero-filled.
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32);
  // A view over memory this tensor does not own (e.g. a named view into a flat buffer). The
  // caller keeps the memory alive; `owner` may hold a reference to do that.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          std::shared_ptr<Storage> owner = nullptr);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;  // d < 0 counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  std::string shape_string() const { return gale::shape_string(shape_); }

  template <class T>
  T* data() const {
    GALE_CHECK(dtype_ == dtype_of<T>()) << "tensor is " << dtype_name(dtype_) << ", asked for " << dtype_name(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  void* raw() const { return data_; }
  // Whether this Tensor is the only holder of its whole storage (no other Tensor shares it, and it
  // spans all of it): releasing it returns exactly nbytes() to the allocator.
  bool sole_owner() const {
    return storage_ && storage_.use_count() == 1 && data_ == storage_->data() && storage_->bytes() == nbytes();
  }

  // Same storage, new shape with the same number of elements. One dimension may be -1.
  Tensor view(const Shape& shape) const;
  // Rows [start, start+len) of the first dimension (a contiguous range), sharing storage.
  Tensor slice(int64_t start, int64_t len) const;

  Tensor clone() const;
  void copy_from(const Tensor& src);  // same dtype and numel
  // Large tensors on all threads (parallel_for), small ones inline. From kStreamingZeroBytes on
  // (the flat gradient buffer every step) with non-temporal stores where the CPU has them: the
  // zeros would not stay in cache anyway, and plain stores first read every line they write
  // (500 MB on 2 threads: 31 ms with memset, 17-19 ms streamed).
  void zero();
  void fill(float value);  // f32 and bf16 only

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  bool defined_ = false;
};

}  // namespace gale
