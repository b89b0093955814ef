// spdlog set-up: the console on rank 0 (errors on every rank), one log file per rank.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace xlme::logging {

struct Options {
  std::string level = "info";  // trace, debug, info, warn, error, off
  int rank = 0;
  std::string dir;  // folder for "rank<N>.log"; empty: console only
};

// Replaces spdlog's default logger. Returns the log file's path, or "" without a file.
std::string init(const Options& options);

// "info" -> spdlog::level::info; throws xlme::Error listing the valid names otherwise.
spdlog::level::level_enum parse_level(const std::string& name);

}  // namespace xlme::logging
