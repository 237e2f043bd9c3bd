// Scratch buffers on the counting host allocator.
#include "kernels/cpu/scratch.h"

#include "core/allocator.h"

namespace gale {

ScratchBuffer::ScratchBuffer(size_t bytes) { reserve(bytes); }

ScratchBuffer::~ScratchBuffer() { host_allocator().deallocate(data_, bytes_); }

void ScratchBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  host_allocator().deallocate(data_, bytes_);
  data_ = host_allocator().allocate(bytes);
  bytes_ = bytes;
}

}  // namespace gale
