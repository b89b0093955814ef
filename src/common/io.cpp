#include "xlme/common/io.h"

#include "xlme/common/error.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace xlme {

namespace fs = std::filesystem;

namespace {

std::string io_failure(int err, const std::string& path, uint64_t needed,
                       const std::string& folder) {
  const double mb = 1024.0 * 1024.0;
  if (err == ENOSPC || err == EDQUOT) {
    return fmt::format(
        "no space left on the device writing '{}' (needed ~{:.1f} MB, {:.1f} MB free in '{}'); "
        "free space or choose another folder; the files written before are untouched",
        path, needed / mb, free_bytes(folder) / mb, folder);
  }
  if (err == EFBIG) {
    return fmt::format(
        "cannot write '{}': the file would exceed the file-size limit (needed ~{:.1f} MB; see "
        "`ulimit -f`); the files written before are untouched",
        path, needed / mb);
  }
  return fmt::format("cannot write '{}' ({:.1f} MB): {}; the files written before are untouched",
                     path, needed / mb, std::strerror(err));
}

}  // namespace

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  XLME_CHECK(fd >= 0, "cannot open '{}' to sync it: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  XLME_CHECK(rc == 0, "cannot sync '{}' to disk: {}", path, std::strerror(err));
}

uint64_t free_bytes(const std::string& path) {
  struct statvfs info {};
  if (::statvfs(path.c_str(), &info) != 0) return 0;
  return static_cast<uint64_t>(info.f_bavail) * info.f_frsize;
}

void write_file_streamed(const std::string& path,
                         const std::function<void(const ByteSink&)>& produce) {
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(folder, ec);
  XLME_CHECK(!ec, "cannot create folder '{}' for '{}': {}", folder.string(), path, ec.message());
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const int fd = create_own_file(tmp, "the temporary file");
  int err = 0;         // the first failed write's errno
  uint64_t total = 0;  // every byte handed over, also after a failure
  const ByteSink sink = [&](const void* data, std::size_t size) -> std::size_t {
    total += size;
    const auto* bytes = static_cast<const char*>(data);
    for (std::size_t done = 0; err == 0 && done < size;) {
      const ssize_t n = ::write(fd, bytes + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        err = n < 0 ? errno : ENOSPC;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    return size;  // the producer runs to its end, so that `total` is the size it needed
  };
  try {
    produce(sink);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    if (err != 0) throw Error(io_failure(err, path, total, folder.string()), __FILE__, __LINE__);
    throw;
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    throw Error(io_failure(err, path, total, folder.string()), __FILE__, __LINE__);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    XLME_FAIL("cannot rename '{}' to '{}': {}", tmp, path, std::strerror(rename_err));
  }
  fsync_path(folder.string(), O_RDONLY | O_DIRECTORY);
}

void write_file_atomic(const std::string& path, const std::string& content) {
  write_file_streamed(path, [&](const ByteSink& sink) { sink(content.data(), content.size()); });
}

std::string read_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  // O_NONBLOCK: a FIFO in the file's place opens without waiting for a writer, and is refused
  // below; regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  XLME_CHECK(fd >= 0, "cannot read {} '{}': {}; check the path and the file's permissions", what,
             path, std::strerror(errno));
  struct stat info {};
  const int err = ::fstat(fd, &info) != 0 ? errno : 0;
  if (err != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    XLME_CHECK(err == 0, "cannot read {} '{}': {}", what, path, std::strerror(err));
    XLME_FAIL("cannot read {} '{}': it is {}, not a regular file; pass the path of a file", what,
              path, file_type_name(info.st_mode));
  }
  std::string bytes;
  if (static_cast<uint64_t>(info.st_size) > max_bytes) {
    ::close(fd);
    XLME_FAIL("{} '{}' is {} bytes, more than the {} it may hold", what, path, info.st_size,
              max_bytes);
  }
  bytes.reserve(static_cast<std::size_t>(info.st_size));
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int read_err = n < 0 ? errno : 0;
      ::close(fd);
      XLME_CHECK(read_err == 0, "cannot read {} '{}': {}; check the disk and the file", what, path,
                 std::strerror(read_err));
      return bytes;
    }
    if (bytes.size() + static_cast<uint64_t>(n) > max_bytes) {
      ::close(fd);
      XLME_FAIL("{} '{}' grew past the {} bytes it may hold while it was read", what, path,
                max_bytes);
    }
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown host";
  return name;
}

void require_plain_file_or_missing(const std::string& path, const std::string& what) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return;
  XLME_CHECK(S_ISREG(info.st_mode),
             "{} '{}' is {}, not a regular file; xlme never writes through it (a link would "
             "overwrite its target): remove or rename it, and run again",
             what, path, file_type_name(info.st_mode));
}

namespace {

// Throws unless the open file `fd` (at `path`) is a regular file with no other hard link; closes
// `fd` first.
void require_own_file(int fd, const std::string& path, const std::string& what) {
  struct stat info {};
  const bool stat_ok = ::fstat(fd, &info) == 0;
  if (stat_ok && S_ISREG(info.st_mode) && info.st_nlink <= 1) return;
  ::close(fd);
  XLME_CHECK(stat_ok, "cannot inspect {} '{}': {}", what, path, std::strerror(errno));
  require_plain_file_or_missing(path, what);
  XLME_FAIL(
      "{} '{}' has {} hard links: writing it would change the same file under its other names; "
      "remove '{}' (the other names keep their data) or choose another output",
      what, path, info.st_nlink, path);
}

}  // namespace

int open_own_file(const std::string& path, uint64_t keep_bytes, const std::string& what) {
  const int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC | (keep_bytes == 0 ? O_CREAT : 0);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0 && errno == ELOOP) require_plain_file_or_missing(path, what);
  XLME_CHECK(fd >= 0, "cannot open {} '{}': {}", what, path, std::strerror(errno));
  require_own_file(fd, path, what);
  struct stat info {};
  ::fstat(fd, &info);
  if (static_cast<uint64_t>(info.st_size) < keep_bytes) {
    ::close(fd);
    XLME_FAIL(
        "cannot resume: {} '{}' is shorter ({} bytes) than its checkpoint ({} bytes); "
        "delete the .progress file beside it to start over",
        what, path, info.st_size, keep_bytes);
  }
  if (::ftruncate(fd, static_cast<off_t>(keep_bytes)) != 0 || ::lseek(fd, 0, SEEK_END) < 0) {
    const int err = errno;
    ::close(fd);
    XLME_FAIL("cannot write {} '{}': {}", what, path, std::strerror(err));
  }
  return fd;
}

int create_own_file(const std::string& path, const std::string& what) {
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    const int err = errno;
    struct stat info {};
    XLME_CHECK(err == EEXIST && attempt == 0 && ::lstat(path.c_str(), &info) == 0,
               "cannot create {} '{}': {}", what, path, std::strerror(err));
    if (!S_ISREG(info.st_mode)) require_plain_file_or_missing(path, what);
    XLME_CHECK(info.st_nlink <= 1,
               "{} '{}' exists with {} hard links: replacing it could lose the data under its "
               "other names; remove it or choose another output",
               what, path, info.st_nlink);
    // A regular file of an earlier process with the same pid (killed): replaced.
    XLME_CHECK(::unlink(path.c_str()) == 0, "cannot replace {} '{}': {}", what, path,
               std::strerror(errno));
  }
}

FileLock::FileLock(const std::string& path, const std::string& what, const std::string& clash,
                   bool remove_when_done)
    : path_(path), remove_when_done_(remove_when_done) {
  for (;;) {
    // O_NOFOLLOW: a lock file that is a symbolic link is refused, never truncated through it.
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd_ < 0 && errno == ELOOP) require_plain_file_or_missing(path, "the lock file of " + what);
    XLME_CHECK(fd_ >= 0, "cannot open the lock file '{}' of {}: {}", path, what,
               std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode) || info.st_nlink > 1) {
      const int fd = fd_;
      fd_ = -1;
      require_own_file(fd, path, "the lock file of " + what);
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char holder[512] = {};
      const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
      ::close(fd_);
      fd_ = -1;
      XLME_CHECK(err != EWOULDBLOCK,
                 "{} is in use by another process ({}; lock file '{}'): {}; wait for it to end, "
                 "stop it, or choose another folder",
                 what, n > 0 ? std::string(holder, static_cast<std::size_t>(n)) : "holder unknown",
                 path, clash);
      XLME_FAIL("cannot lock '{}' ({}): {}", path, what, std::strerror(err));
    }
    // A holder that removes its lock file when done may have removed the file this process
    // opened before it locked it: then the lock is on a file no longer at `path`; open it again.
    struct stat now {};
    if (::stat(path.c_str(), &now) == 0 && now.st_dev == info.st_dev && now.st_ino == info.st_ino) {
      break;
    }
    ::close(fd_);
  }
  const std::string holder = fmt::format("pid {} on host {}", ::getpid(), host_name());
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    const int err = errno;
    ::close(fd_);
    XLME_FAIL("cannot write the lock file '{}' of {}: {}", path, what, std::strerror(err));
  }
}

FileLock::~FileLock() {
  if (fd_ < 0) return;
  if (remove_when_done_) ::unlink(path_.c_str());  // still locked: see the constructor
  ::close(fd_);
}

const char* file_type_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a file of an unknown type";
}

}  // namespace xlme
