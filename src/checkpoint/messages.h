// Helpers for the checkpoint area's error messages (private to src/checkpoint).
#pragma once

#include "xlme/common/json.h"

#include <fmt/format.h>

#include <string>

namespace xlme::checkpoint {

// `text` from an untrusted file, for a message: quoted, control characters escaped, at most 120
// bytes of it.
inline std::string shown(const std::string& text) {
  constexpr std::size_t kShown = 120;
  if (text.size() <= kShown) return json_quote(text);
  return fmt::format("{}... ({} bytes)", json_quote(text.substr(0, kShown)), text.size());
}

}  // namespace xlme::checkpoint
