// Small text and hashing helpers shared by the data area.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace xlme::data {

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view text);

// 64-bit FNV-1a followed by a SplitMix64 finalizer: stable across platforms and runs, so it can
// decide held-out splits and identify tokenizer models in shard headers.
uint64_t hash64(std::string_view bytes);

// `text` with runs of whitespace (space, tab, CR, LF, VT, FF) collapsed to one space and trimmed.
std::string collapse_whitespace(std::string_view text);

}  // namespace xlme::data
