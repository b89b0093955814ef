#include "xlme/data/mo_file.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"

#include <cstdint>
#include <cstring>

namespace xlme::data {
namespace {

constexpr uint32_t kMoMagic = 0x950412de;
constexpr uint32_t kMoMagicSwapped = 0xde120495;
constexpr size_t kMoHeaderBytes = 28;

// 32-bit words of a catalog in the byte order its magic number announces.
class MoReader {
 public:
  MoReader(const std::string& bytes, const std::string& name) : bytes_(bytes), name_(name) {
    XLME_CHECK(bytes.size() >= kMoHeaderBytes,
               "{} is not a gettext .mo file: {} bytes, a header needs {} (offset 0); rebuild it "
               "with msgfmt",
               name, bytes.size(), kMoHeaderBytes);
    const uint32_t magic = raw(0);
    XLME_CHECK(magic == kMoMagic || magic == kMoMagicSwapped,
               "{} is not a gettext .mo file: magic number 0x{:08x} at offset 0, expected "
               "0x950412de in either byte order",
               name, magic);
    swapped_ = magic == kMoMagicSwapped;
  }

  uint32_t word(size_t offset, const char* what) const {
    XLME_CHECK(offset + 4 <= bytes_.size(),
               "{} is truncated: the {} at offset {} lies past its end ({} bytes)", name_, what,
               offset, bytes_.size());
    const uint32_t value = raw(offset);
    return swapped_ ? __builtin_bswap32(value) : value;
  }

  // The string a (length, offset) descriptor at `descriptor` points to.
  std::string string_at(size_t descriptor, const char* table) const {
    const uint32_t length = word(descriptor, table);
    const uint32_t offset = word(descriptor + 4, table);
    XLME_CHECK(uint64_t{offset} + length <= bytes_.size(),
               "{} is truncated or corrupt: the {} descriptor at offset {} points to {} bytes at "
               "offset {}, past the end of the file ({} bytes)",
               name_, table, descriptor, length, offset, bytes_.size());
    return bytes_.substr(offset, length);
  }

 private:
  uint32_t raw(size_t offset) const {
    uint32_t value;
    std::memcpy(&value, bytes_.data() + offset, 4);
    return value;
  }

  const std::string& bytes_;
  const std::string& name_;
  bool swapped_ = false;
};

std::vector<std::string> split_nul(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t nul; (nul = s.find('\0', start)) != std::string::npos; start = nul + 1) {
    parts.push_back(s.substr(start, nul - start));
  }
  parts.push_back(s.substr(start));
  return parts;
}

}  // namespace

std::vector<MoEntry> parse_mo(const std::string& bytes, const std::string& name) {
  const MoReader reader(bytes, name);
  const uint32_t revision = reader.word(4, "revision");
  XLME_CHECK(revision >> 16 <= 1,
             "{}: unsupported .mo major revision {} at offset 4 (this reader knows 0 and 1)", name,
             revision >> 16);
  const uint32_t count = reader.word(8, "string count");
  const uint32_t originals = reader.word(12, "original-table offset");
  const uint32_t translations = reader.word(16, "translation-table offset");
  for (const auto& [table, what] : {std::pair{originals, "original-string table"},
                                    std::pair{translations, "translation table"}}) {
    XLME_CHECK(uint64_t{table} + uint64_t{count} * 8 <= bytes.size(),
               "{} is truncated or corrupt: the {} at offset {} needs {} bytes for {} strings, "
               "the file has {}",
               name, what, table, uint64_t{count} * 8, count, bytes.size());
  }

  std::vector<MoEntry> entries;
  entries.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string original = reader.string_at(originals + size_t{8} * i, "original-string");
    const std::string translation = reader.string_at(translations + size_t{8} * i, "translation");
    MoEntry entry;
    if (const size_t eot = original.find('\x04'); eot != std::string::npos) {
      entry.context = original.substr(0, eot);
      original.erase(0, eot + 1);
    }
    if (original.empty() && entry.context.empty()) continue;  // the header entry
    auto ids = split_nul(original);
    entry.msgid = std::move(ids[0]);
    if (ids.size() > 1) entry.msgid_plural = std::move(ids[1]);
    entry.msgstrs = split_nul(translation);
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<MoEntry> read_mo(const std::string& path) {
  return parse_mo(read_file(path, ".mo file"), path);
}

}  // namespace xlme::data
