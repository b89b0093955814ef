#include "xlme/common/logging.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <filesystem>
#include <memory>
#include <vector>

namespace xlme::logging {

spdlog::level::level_enum parse_level(const std::string& name) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  for (const auto& [text, level] : kLevels) {
    if (name == text) return level;
  }
  XLME_FAIL("unknown log level '{}'; use one of: trace, debug, info, warn, error, off", name);
}

std::string init(const Options& options) {
  const auto level = parse_level(options.level);
  std::vector<spdlog::sink_ptr> sinks;
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  // Rank 0 speaks for the job; the other ranks only report their own errors on the console.
  console->set_level(options.rank == 0 ? level : std::max(level, spdlog::level::err));
  console->set_pattern(options.rank == 0
                           ? "[%H:%M:%S] %^%l%$: %v"
                           : fmt::format("[%H:%M:%S] %^%l%$ [rank {}]: %v", options.rank));
  sinks.push_back(console);
  std::string file;
  if (!options.dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.dir, ec);
    XLME_CHECK(!ec, "cannot create the log folder '{}': {}", options.dir, ec.message());
    file = (std::filesystem::path(options.dir) / fmt::format("rank{}.log", options.rank)).string();
    require_plain_file_or_missing(file, "the log file");
    auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
    file_sink->set_level(level);
    file_sink->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
    sinks.push_back(file_sink);
  }
  auto logger = std::make_shared<spdlog::logger>("xlme", sinks.begin(), sinks.end());
  logger->set_level(level);
  // Every line reaches the file as it is logged, so that a rank killed by a signal (SIGKILL, a
  // watchdog's exit) leaves its log ending with its last complete line, not with a cut buffer.
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  return file;
}

}  // namespace xlme::logging
