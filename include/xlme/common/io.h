// File helpers shared by every area.
#pragma once

#include <string>

namespace xlme {

// Replaces `path` with `content` atomically: writes `path.tmp-<pid>` beside it, fsyncs it,
// renames it over `path` and fsyncs the folder, so that a crash leaves the old file or the new
// one, never a truncated mix. Creates missing parent folders.
void write_file_atomic(const std::string& path, const std::string& content);

// fsync()s a file (flags O_RDONLY) or a folder (O_RDONLY | O_DIRECTORY); throws xlme::Error
// naming the path.
void fsync_path(const std::string& path, int flags);

}  // namespace xlme
