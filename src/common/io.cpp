#include "xlme/common/io.h"

#include "xlme/common/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace xlme {

namespace fs = std::filesystem;

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  XLME_CHECK(fd >= 0, "cannot open '{}' to sync it: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  XLME_CHECK(rc == 0, "cannot sync '{}' to disk: {}", path, std::strerror(err));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(folder, ec);
  XLME_CHECK(!ec, "cannot create folder '{}' for '{}': {}", folder.string(), path, ec.message());
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  XLME_CHECK(fd >= 0, "cannot create '{}': {}", tmp, std::strerror(errno));
  std::size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      XLME_FAIL("cannot write '{}': {} (is the disk full?)", tmp, std::strerror(err));
    }
    written += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) {
    ::unlink(tmp.c_str());
    XLME_FAIL("cannot sync '{}' to disk: {}", tmp, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    XLME_FAIL("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(rename_err));
  }
  fsync_path(folder.string(), O_RDONLY | O_DIRECTORY);
}

}  // namespace xlme
