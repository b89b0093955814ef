#include "xlme/common/error.h"

#include <utility>

namespace xlme {

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(std::move(message)), location_(fmt::format("{}:{}", file, line)) {}

}  // namespace xlme
