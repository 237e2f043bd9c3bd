// The swap optimizer's anonymous state file, its chunk plan and its staging buffer.
#include "optim/state_swap.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/check.h"

namespace gale {

std::vector<int64_t> plan_swap_chunks(const std::vector<StateRun>& runs, int64_t numel, int64_t times, int64_t align) {
  GALE_CHECK(numel >= 0 && align >= 1);
  std::vector<int64_t> bounds = {0};
  if (numel == 0) return bounds;
  const int64_t t = std::max<int64_t>(times, 1);
  for (int64_t j = 1; j < t; ++j) {
    int64_t b = (j * numel + t - 1) / t;  // ⌈j·numel/t⌉
    for (const StateRun& r : runs)
      if (r.begin < b && b < r.begin + r.numel) {
        b = std::min(r.begin + r.numel, r.begin + (b - r.begin + align - 1) / align * align);
        break;
      }
    if (b > bounds.back() && b < numel) bounds.push_back(b);
  }
  bounds.push_back(numel);
  return bounds;
}

namespace {

std::string errno_text() { return std::strerror(errno); }

}  // namespace

StatusOr<std::unique_ptr<SwapFile>> SwapFile::create(const std::string& dir, int64_t bytes) {
  std::string path = (dir.empty() ? std::string(".") : dir) + "/gale-swap-optimizer-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  path.assign(name.data());
  if (fd < 0)
    return IOError("--swap-optimizer-dir ", dir, ": cannot create the swap file ", path, ": ", errno_text());
  ::unlink(path.c_str());  // anonymous from now on: gone when closed, even after a crash
  if (bytes > 0) {
    // Reserve the blocks now, so that a full disk shows at start-up; file systems without
    // fallocate get a sparse file of the right size.
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc == EOPNOTSUPP || rc == EINVAL) rc = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
    if (rc != 0) {
      ::close(fd);
      return IOError("--swap-optimizer-dir ", dir, ": cannot reserve ", bytes, " bytes for the swap file ", path, ": ",
                     std::strerror(rc));
    }
  }
  return std::unique_ptr<SwapFile>(new SwapFile(fd, path, bytes));
}

SwapFile::~SwapFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status SwapFile::write(int64_t offset, const void* data, int64_t bytes) {
  GALE_CHECK(offset >= 0 && offset + bytes <= size_) << "swap file " << path_ << ": write past its " << size_ << " bytes";
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return IOError("swap file ", path_, ": write of ", bytes, " bytes at ", offset, " failed: ",
                     n < 0 ? errno_text() : std::string("nothing written"));
    p += n;
    offset += n;
    bytes -= n;
  }
  return Status::Ok();
}

Status SwapFile::read(int64_t offset, void* data, int64_t bytes) const {
  GALE_CHECK(offset >= 0 && offset + bytes <= size_) << "swap file " << path_ << ": read past its " << size_ << " bytes";
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, static_cast<size_t>(bytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return IOError("swap file ", path_, ": read of ", bytes, " bytes at ", offset, " failed: ",
                     n < 0 ? errno_text() : std::string("end of file"));
    p += n;
    offset += n;
    bytes -= n;
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<OptimizerStateSwap>> OptimizerStateSwap::create(const std::string& dir, int num_states,
                                                                         int64_t numel, std::vector<int64_t> bounds) {
  GALE_CHECK(num_states >= 0 && numel >= 0);
  GALE_CHECK(!bounds.empty() && bounds.front() == 0 && bounds.back() == numel) << "swap chunk plan";
  std::unique_ptr<OptimizerStateSwap> s(new OptimizerStateSwap());
  GALE_ASSIGN_OR_RETURN(s->file_, SwapFile::create(dir, static_cast<int64_t>(num_states) * numel * 4));
  s->num_states_ = num_states;
  s->numel_ = numel;
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    GALE_CHECK(bounds[c + 1] > bounds[c]) << "swap chunk plan: empty chunk " << c;
    s->max_chunk_ = std::max(s->max_chunk_, bounds[c + 1] - bounds[c]);
  }
  s->bounds_ = std::move(bounds);
  if (num_states > 0 && s->max_chunk_ > 0) s->staging_ = Tensor::empty({num_states * s->max_chunk_});
  return s;
}

int OptimizerStateSwap::chunk_of(int64_t index) const {
  GALE_CHECK(index >= 0 && index < numel_) << "state element " << index << " of " << numel_;
  return static_cast<int>(std::upper_bound(bounds_.begin(), bounds_.end(), index) - bounds_.begin()) - 1;
}

Status OptimizerStateSwap::transfer(int c, bool to_file) {
  const int64_t begin = bounds_[static_cast<size_t>(c)], n = bounds_[static_cast<size_t>(c) + 1] - begin;
  for (int k = 0; k < num_states_; ++k) {
    float* staged = staging_.data<float>() + static_cast<int64_t>(k) * max_chunk_;
    GALE_RETURN_IF_ERROR(to_file ? file_->write(file_offset(k, begin), staged, n * 4)
                                 : file_->read(file_offset(k, begin), staged, n * 4));
  }
  return Status::Ok();
}

void OptimizerStateSwap::load(int c) {
  GALE_CHECK(c >= 0 && c < num_chunks()) << "swap chunk " << c << " of " << num_chunks();
  if (resident_ == c) return;
  flush();
  const Status st = transfer(c, /*to_file=*/false);
  GALE_CHECK(st.ok()) << "--swap-optimizer: " << st.message();
  resident_ = c;
}

void OptimizerStateSwap::flush() {
  if (resident_ < 0) return;
  const Status st = transfer(resident_, /*to_file=*/true);
  GALE_CHECK(st.ok()) << "--swap-optimizer: " << st.message();
  resident_ = -1;
}

Status OptimizerStateSwap::read(int k, int64_t begin, int64_t n, float* out) const {
  GALE_CHECK(resident_ < 0 && k >= 0 && k < num_states_ && begin >= 0 && begin + n <= numel_);
  return file_->read(file_offset(k, begin), out, n * 4);
}

Status OptimizerStateSwap::write(int k, int64_t begin, int64_t n, const float* in) {
  GALE_CHECK(resident_ < 0 && k >= 0 && k < num_states_ && begin >= 0 && begin + n <= numel_);
  return file_->write(file_offset(k, begin), in, n * 4);
}

}  // namespace gale
