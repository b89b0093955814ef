// Small text helpers shared by the data area.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace xlme::data {

// The UTF-8 sequence that starts at byte `i` of `text`: its code point and byte length, or
// valid = false (length 1) when the byte at `i` does not start a well-formed sequence (a
// continuation or invalid lead byte, a truncated sequence, an overlong form, a surrogate or a code
// point past U+10FFFF).
struct Utf8Char {
  char32_t code_point = 0;
  size_t length = 1;
  bool valid = false;
};
Utf8Char utf8_char_at(std::string_view text, size_t i);

// True when `text` is well-formed UTF-8: utf8_char_at is valid at every sequence start.
bool valid_utf8(std::string_view text);

// Whether `code` can name a language (de, zh-yue) or, with its '-', a pair (en-de) in a corpus
// file name: letters, digits, '_' and '-', not empty and not starting with '-' (a file "-rf.txt"
// would become an option in a shell command).
bool is_language_code(std::string_view code);

// Throws xlme::Error when the corpus file `path`, whose name says it holds language (or pair)
// `code`, cannot be read as one: `code` is not a language code, or `path` is not a regular file
// (a dangling symbolic link — an unmounted file system —, a FIFO, a folder, a device), so that
// no language is silently left out of training.
void check_corpus_file(const std::string& path, const std::string& code);

// A SentencePiece piece covers at most 16 code points (max_sentencepiece_length's default), 64
// UTF-8 bytes: `n` tokens never need more than n * kMaxBytesPerPiece bytes of a text (runs of
// whitespace, which make no piece, aside). Texts are cut to that before tokenization, which
// bounds the tokenizer's memory on a hostile line (~80 bytes per input byte).
constexpr int64_t kMaxBytesPerPiece = 64;

// The longest prefix of `text` of at most `bytes` bytes that ends on a code-point boundary.
std::string_view utf8_prefix(std::string_view text, size_t bytes);

// `text` with runs of whitespace (space, tab, CR, LF, VT, FF) collapsed to one space and trimmed.
std::string collapse_whitespace(std::string_view text);

}  // namespace xlme::data
