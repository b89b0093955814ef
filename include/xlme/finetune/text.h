// Text as XTREME's Python code sees it: UTF-8 decoded to code points, and Python's str methods
// (split, strip, lower, isspace) and the Unicode classes the official scripts use (category P*,
// re's \w). One home for the readers (xtreme_io), featurization (features) and the metrics.
// The Unicode tables come from Python (scripts/gen_unicode_tables.py, unicode_tables.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace xlme::finetune::text {

// ---- UTF-8 -------------------------------------------------------------------------------------

// The code points of UTF-8 `text`; a byte that does not start a well-formed sequence (see
// data::utf8_char_at) becomes U+FFFD and decoding goes on at the next byte.
std::u32string decode_utf8(std::string_view text);

std::string encode_utf8(std::u32string_view text);

// The byte offset of code point `index` in UTF-8 `text` (text.size() just past the end); -1 when
// `text` has fewer code points. Counts lead bytes, as Python indexes a str decoded from the file.
int64_t byte_offset_of_code_point(std::string_view text, int64_t index);

// ---- Python's str ------------------------------------------------------------------------------

// str.isspace(): the separators of str.split() and str.strip().
bool is_space(char32_t cp);

// str.split() without arguments: runs of is_space characters separate, none are kept.
std::vector<std::u32string> split(std::u32string_view text);

// " ".join(parts).
std::u32string join(const std::vector<std::u32string>& parts);

// " ".join(text.split()): whitespace collapsed to single spaces and stripped.
std::u32string collapse(std::u32string_view text);

// str.strip().
std::u32string strip(std::u32string_view text);

// str.lower(), including the context-dependent Final_Sigma rule for U+03A3.
std::u32string lower(std::u32string_view text);

// ---- Unicode classes ---------------------------------------------------------------------------

// General category P* (unicodedata.category(c).startswith("P")).
bool is_punctuation(char32_t cp);

// Python's string.punctuation (the 32 ASCII punctuation characters).
bool is_ascii_punctuation(char32_t cp);

// re's \w on str: str.isalnum() or '_'.
bool is_word(char32_t cp);

// General category C* (control, format, unassigned, private use, surrogate).
bool is_other(char32_t cp);

// General category Zs.
bool is_space_separator(char32_t cp);

// ---- Bytes -------------------------------------------------------------------------------------

// str.strip() for ASCII whitespace only (" \t\r\n\v\f"), on bytes: what XTREME's readers strip
// from fields and lines of its files.
std::string strip_ascii(std::string_view text);

// The TAB-separated fields of `line` (one field when it has no TAB; empty fields kept).
std::vector<std::string> split_tabs(std::string_view line);

// The fields of `line` separated by runs of ASCII whitespace (C++ stream extraction).
std::vector<std::string> split_ascii(std::string_view line);

}  // namespace xlme::finetune::text
