// The checksums and hashes that files on disk record: CRC32 of shards and checkpoint files (the
// manifest), hash64 of tokenizer models (shard headers) and of held-out messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace xlme {

// CRC32 (zlib's polynomial) of `size` bytes at `data`, continuing from `crc` (0 to start), so
// that crc32_update(crc32_update(0, a), b) is the CRC32 of a followed by b.
uint32_t crc32_update(uint32_t crc, const void* data, std::size_t size);

// CRC32 of the whole file `path`, read in chunks; throws xlme::Error naming the file.
uint32_t file_crc32(const std::string& path);

// 64-bit FNV-1a followed by a SplitMix64 finalizer: stable across platforms and runs, so it can
// decide held-out splits and identify tokenizer models in shard headers.
uint64_t hash64(std::string_view bytes);

}  // namespace xlme
