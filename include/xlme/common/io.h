// File helpers shared by every area.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <sys/types.h>

namespace xlme {

// Receives the bytes of a file being written, in order; returns how many it took (all of them).
using ByteSink = std::function<std::size_t(const void* data, std::size_t size)>;

// Writes `path` atomically from what `produce` hands to its sink: the bytes go to
// `path.tmp-<pid>` beside it, every write is checked, the file is fsynced and renamed over `path`
// and the folder fsynced, so that a crash leaves the old file or the new one, never a truncated
// mix. On a failed write (disk full, file-size limit) the sink keeps counting what `produce` hands
// it, the temporary file is removed, `path` is left as it was, and an xlme::Error says e.g. "no
// space left on the device writing 'PATH' (needed ~N MB, M MB free)". Creates missing folders.
void write_file_streamed(const std::string& path,
                         const std::function<void(const ByteSink&)>& produce);

// write_file_streamed with `content`.
void write_file_atomic(const std::string& path, const std::string& content);

// The bytes of the regular file `path`, all of them. Throws xlme::Error naming `what` (e.g.
// "tokenizer"), the file, and the operating system's reason: "cannot read tokenizer 'x.model': No
// such file or directory; check the path and the file's permissions". A file longer than
// `max_bytes` (it grew since its size was checked) is an error naming it, read no further.
std::string read_file(const std::string& path, const std::string& what = "file",
                      uint64_t max_bytes = UINT64_MAX);

// fsync()s a file (flags O_RDONLY) or a folder (O_RDONLY | O_DIRECTORY); throws xlme::Error
// naming the path.
void fsync_path(const std::string& path, int flags);

// Bytes available to this user on the file system holding `path` (0 when unknown).
uint64_t free_bytes(const std::string& path);

// Throws xlme::Error naming `what` (e.g. "metrics file") and `path` when `path` exists and is not
// a regular file: a symbolic link (whose target a write would change), a FIFO, a folder... Files
// a run creates or appends to in its folder are checked with it before they are opened.
void require_plain_file_or_missing(const std::string& path, const std::string& what);

// Opens `path` for appending as a file of this program's own and returns its descriptor,
// positioned at its end: with `keep_bytes` = 0 it is created or emptied, else it must exist with at
// least `keep_bytes` bytes and is cut to them (a resume). Refused, naming `what` and the path and
// touching nothing, when `path` is a symbolic link, not a regular file, or a file with other hard
// links: a write would reach a file elsewhere through it.
int open_own_file(const std::string& path, uint64_t keep_bytes, const std::string& what);

// Creates `path` for writing as a new file (O_EXCL: never through a link planted at its name) and
// returns its descriptor. A regular file left there by an earlier process is replaced; anything
// else (a link, a folder, a file with other hard links) is refused, naming `what`.
int create_own_file(const std::string& path, const std::string& what);

// An exclusive advisory lock (flock) on a file, held until destruction; the operating system
// releases it when the process ends, crash included. The file records the holder's pid and host.
class FileLock {
 public:
  // Takes the lock on `path` (created if missing) or throws xlme::Error naming `what`, the file,
  // the holder's pid and host and `clash` (what two holders would do), without waiting. A `path`
  // that is a symbolic link, not a regular file, or a file with other hard links is refused,
  // never written through. With
  // `remove_when_done` the file is removed when the lock is released (while still held, so that
  // a process waiting on the removed file opens the path again).
  FileLock(const std::string& path, const std::string& what,
           const std::string& clash =
               "two runs in one folder would overwrite each other's "
               "checkpoints and metrics",
           bool remove_when_done = false);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool remove_when_done_ = false;
  int fd_ = -1;
};

// The host name (for messages that say where a process runs).
std::string host_name();

// What a stat() `mode` is, for messages such as "'x' is a FIFO (named pipe), not a regular file":
// "a regular file", "a folder", "a FIFO (named pipe)", "a character device", "a block device",
// "a socket", "a symbolic link" or "a file of an unknown type".
const char* file_type_name(mode_t mode);

}  // namespace xlme
