// Writing a whole buffer to a file descriptor, retrying short writes and EINTR (the event-file writers).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gale {

// Writes all of `bytes` to `fd`; an error names `path` and the system's reason.
inline Status write_all_to_fd(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IOError("cannot write ", path, ": ", std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace gale
