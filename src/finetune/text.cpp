#include "xlme/finetune/text.h"

#include "unicode_tables.h"
#include "xlme/data/text.h"

#include <algorithm>

namespace xlme::finetune::text {

// ---- UTF-8 -------------------------------------------------------------------------------------

std::u32string decode_utf8(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = data::utf8_char_at(text, i);
    out.push_back(c.valid ? c.code_point : U'\ufffd');
    i += c.length;
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t cp : text) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  return out;
}

int64_t byte_offset_of_code_point(std::string_view text, int64_t index) {
  if (index < 0) return -1;
  int64_t seen = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xc0) == 0x80) continue;  // continuation byte
    if (seen == index) return static_cast<int64_t>(i);
    ++seen;
  }
  return seen == index ? static_cast<int64_t>(text.size()) : -1;
}

// ---- Python's str ------------------------------------------------------------------------------

bool is_space(char32_t cp) {
  return unicode::in_ranges(unicode::kSpace, unicode::kSpace_size, cp);
}

std::vector<std::u32string> split(std::u32string_view text) {
  std::vector<std::u32string> out;
  bool in_token = false;
  for (const char32_t cp : text) {
    if (is_space(cp)) {
      in_token = false;
    } else {
      if (!in_token) out.emplace_back();
      out.back().push_back(cp);
      in_token = true;
    }
  }
  return out;
}

std::u32string join(const std::vector<std::u32string>& parts) {
  std::u32string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out.push_back(U' ');
    out += parts[i];
  }
  return out;
}

std::u32string collapse(std::u32string_view text) {
  return join(split(text));
}

std::u32string strip(std::u32string_view text) {
  size_t first = 0, last = text.size();
  while (first < last && is_space(text[first])) ++first;
  while (last > first && is_space(text[last - 1])) --last;
  return std::u32string(text.substr(first, last - first));
}

std::u32string lower(std::u32string_view text) {
  auto cased = [](char32_t c) {
    return unicode::in_ranges(unicode::kCased, unicode::kCased_size, c);
  };
  auto ignorable = [](char32_t c) {
    return unicode::in_ranges(unicode::kCaseIgnorable, unicode::kCaseIgnorable_size, c);
  };
  std::u32string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c == 0x3a3) {
      // Final_Sigma: a cased letter (skipping case-ignorables) before, none after.
      size_t j = i;
      while (j > 0 && ignorable(text[j - 1])) --j;
      bool final_sigma = j > 0 && cased(text[j - 1]);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < text.size() && ignorable(text[k])) ++k;
        final_sigma = k == text.size() || !cased(text[k]);
      }
      out.push_back(final_sigma ? 0x3c2 : 0x3c3);
      continue;
    }
    const auto* end = unicode::kLower + unicode::kLower_size;
    const auto* it =
        std::lower_bound(unicode::kLower, end, static_cast<uint32_t>(c),
                         [](const unicode::LowerEntry& e, uint32_t v) { return e.code < v; });
    if (it != end && it->code == c) {
      out.push_back(it->lower1);
      if (it->lower2) out.push_back(it->lower2);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// ---- Unicode classes ---------------------------------------------------------------------------

bool is_punctuation(char32_t cp) {
  return unicode::in_ranges(unicode::kPunctuation, unicode::kPunctuation_size, cp);
}

bool is_ascii_punctuation(char32_t cp) {
  return cp < 0x80 &&
         std::string_view("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~").find(static_cast<char>(cp)) !=
             std::string_view::npos;
}

bool is_word(char32_t cp) {
  return unicode::in_ranges(unicode::kWord, unicode::kWord_size, cp);
}

bool is_other(char32_t cp) {
  return unicode::in_ranges(unicode::kOther, unicode::kOther_size, cp);
}

bool is_space_separator(char32_t cp) {
  return unicode::in_ranges(unicode::kSpaceSeparator, unicode::kSpaceSeparator_size, cp);
}

// ---- Bytes -------------------------------------------------------------------------------------

std::string strip_ascii(std::string_view text) {
  constexpr std::string_view kWhitespace = " \t\r\n\v\f";
  const size_t first = text.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return "";
  return std::string(text.substr(first, text.find_last_not_of(kWhitespace) - first + 1));
}

std::vector<std::string> split_tabs(std::string_view line) {
  std::vector<std::string> fields;
  size_t start = 0;
  while (true) {
    const size_t tab = line.find('\t', start);
    fields.emplace_back(line.substr(start, tab == std::string_view::npos ? tab : tab - start));
    if (tab == std::string_view::npos) return fields;
    start = tab + 1;
  }
}

std::vector<std::string> split_ascii(std::string_view line) {
  constexpr std::string_view kWhitespace = " \t\r\n\v\f";
  std::vector<std::string> out;
  for (size_t i = line.find_first_not_of(kWhitespace); i != std::string_view::npos;) {
    const size_t end = line.find_first_of(kWhitespace, i);
    out.emplace_back(line.substr(i, end == std::string_view::npos ? end : end - i));
    i = line.find_first_not_of(kWhitespace, end == std::string_view::npos ? line.size() : end);
  }
  return out;
}

}  // namespace xlme::finetune::text
