#include "xlme/data/text.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace xlme::data {

Utf8Char utf8_char_at(std::string_view text, size_t i) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char c = s[i];
  if (c < 0x80) return {c, 1, true};
  size_t len;
  uint32_t cp;
  if ((c & 0xe0) == 0xc0) {
    len = 2;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    len = 3;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    len = 4;
    cp = c & 0x07;
  } else {
    return {};
  }
  if (i + len > text.size()) return {};
  for (size_t k = 1; k < len; ++k) {
    if ((s[i + k] & 0xc0) != 0x80) return {};
    cp = (cp << 6) | (s[i + k] & 0x3f);
  }
  constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return {};
  return {cp, len, true};
}

bool is_language_code(std::string_view code) {
  return !code.empty() && code.front() != '-' && std::all_of(code.begin(), code.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

void check_corpus_file(const std::string& path, const std::string& code) {
  XLME_CHECK(is_language_code(code),
             "corpus file '{}': '{}' is not a language code (letters, digits, '_' and '-', not "
             "starting with '-', e.g. de, zh-yue, en-de); rename the file or move it out of the "
             "corpus folder",
             path, code);
  struct stat target {};
  const int err = ::stat(path.c_str(), &target) == 0 ? 0 : errno;
  if (err == 0 && S_ISREG(target.st_mode)) return;
  if (err != 0) {
    std::error_code ec;
    XLME_CHECK(!std::filesystem::is_symlink(path, ec),
               "corpus file '{}' is a symbolic link to '{}', which does not exist (an unmounted "
               "file system?); language '{}' would be missing from training: mount or fix it, or "
               "remove the link",
               path, std::filesystem::read_symlink(path, ec).string(), code);
    XLME_FAIL("cannot read corpus file '{}': {}; language '{}' would be missing from training",
              path, std::strerror(err), code);
  }
  XLME_FAIL(
      "corpus file '{}' is {}, not a regular file; language '{}' would be missing from "
      "training: replace it with the text file, or remove it",
      path, file_type_name(target.st_mode), code);
}

std::string_view utf8_prefix(std::string_view text, size_t bytes) {
  if (text.size() <= bytes) return text;
  size_t end = bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xc0) == 0x80) --end;
  return text.substr(0, end);
}

bool valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // the common case, without the call
      ++i;
      continue;
    }
    const Utf8Char c = utf8_char_at(text, i);
    if (!c.valid) return false;
    i += c.length;
  }
  return true;
}

std::string collapse_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool space = false;
  for (const char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') {
      space = !out.empty();
    } else {
      if (space) out.push_back(' ');
      space = false;
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace xlme::data
