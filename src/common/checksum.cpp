#include "xlme/common/checksum.h"

#include "xlme/common/error.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace xlme {

uint32_t crc32_update(uint32_t crc, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes 32-bit lengths
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(size, std::size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, bytes, chunk));
    bytes += chunk;
    size -= chunk;
  }
  return crc;
}

uint32_t file_crc32(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  XLME_CHECK(fd >= 0, "cannot read '{}' to check it: {}", path, std::strerror(errno));
  std::vector<char> buffer(1 << 20);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      XLME_CHECK(err == 0, "cannot read '{}' to check it: {}", path, std::strerror(err));
      return crc;
    }
    crc = crc32_update(crc, buffer.data(), static_cast<std::size_t>(n));
  }
}

uint64_t hash64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  // FNV's low bits mix poorly; the SplitMix64 finalizer spreads every input bit over all 64.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

}  // namespace xlme
