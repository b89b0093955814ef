// Writing JSON string literals (metrics lines, safetensors headers, config.json), also valid as
// YAML double-quoted scalars: YAML 1.2 reads JSON's escapes.
#pragma once

#include <string>

namespace xlme {

// "a \"b\"\n" for a "b" + newline: quotes, backslashes and control characters escaped.
std::string json_quote(const std::string& text);

}  // namespace xlme
