// Whole-file read-only mappings.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace gale {

StatusOr<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path, bool use_mmap) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(path, ": no such file");
    return IOError(path, ": cannot open (", std::strerror(errno), ")");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return IOError(path, ": not a regular file");
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = st.st_size;
  if (f->size_ == 0) {
    ::close(fd);
    return f;
  }
  if (use_mmap) {
    void* p = ::mmap(nullptr, static_cast<size_t>(f->size_), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return IOError(path, ": mmap failed (", std::strerror(errno), ")");
    f->data_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
    return f;
  }
  f->heap_.reset(new uint8_t[static_cast<size_t>(f->size_)]);
  int64_t done = 0;
  while (done < f->size_) {
    ssize_t n = ::pread(fd, f->heap_.get() + done, static_cast<size_t>(f->size_ - done), done);
    if (n <= 0) {
      ::close(fd);
      return IOError(path, ": read failed after ", done, " of ", f->size_, " bytes");
    }
    done += n;
  }
  ::close(fd);
  f->data_ = f->heap_.get();
  return f;
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
}

}  // namespace gale
