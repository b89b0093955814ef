// xlme::Error and the XLME_CHECK / XLME_FAIL macros: every user-facing failure in the library.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace xlme {

// An error the user can act on: `what()` is the message alone (it names the file, key or value
// and says what to do); `location()` is the source line that raised it, for bug reports.
class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);

  const std::string& location() const { return location_; }

 private:
  std::string location_;  // "src/config/config.cpp:42"
};

}  // namespace xlme

// Throws xlme::Error with a fmt-formatted message when `cond` is false.
#define XLME_CHECK(cond, ...)                                                       \
  do {                                                                              \
    if (!(cond)) throw ::xlme::Error(fmt::format(__VA_ARGS__), __FILE__, __LINE__); \
  } while (false)

// Throws xlme::Error with a fmt-formatted message.
#define XLME_FAIL(...) throw ::xlme::Error(fmt::format(__VA_ARGS__), __FILE__, __LINE__)
