#include "xlme/data/shard.h"

#include "xlme/common/error.h"
#include "xlme/common/io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace xlme::data {

uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes 32-bit lengths
    const auto chunk = static_cast<uInt>(std::min<size_t>(size, size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, bytes, chunk));
    bytes += chunk;
    size -= chunk;
  }
  return crc;
}

// A read-only mmap of a whole file (an empty file maps to nothing).
struct Shard::Mapping {
  const char* data = nullptr;
  size_t size = 0;

  explicit Mapping(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    XLME_CHECK(fd >= 0, "cannot open shard file '{}': {}; run xlme-data binarize", path,
               std::strerror(errno));
    struct stat st {};
    ::fstat(fd, &st);
    size = static_cast<size_t>(st.st_size);
    if (size > 0) {
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      ::close(fd);
      XLME_CHECK(p != MAP_FAILED, "cannot map shard file '{}': {}", path, std::strerror(errno));
      data = static_cast<const char*>(p);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<char*>(data), size);
  }
};

Shard::Shard(const std::string& stem, bool verify_checksums) : stem_(stem) {
  const std::string idx_path = stem + ".idx", bin_path = stem + ".bin";
  idx_ = std::make_unique<Mapping>(idx_path);
  bin_ = std::make_unique<Mapping>(bin_path);
  XLME_CHECK(idx_->size >= sizeof(ShardHeader),
             "shard index '{}' is truncated: {} bytes, the header alone needs {}; re-run "
             "xlme-data binarize",
             idx_path, idx_->size, sizeof(ShardHeader));
  std::memcpy(&header_, idx_->data, sizeof(ShardHeader));
  XLME_CHECK(std::memcmp(header_.magic, kShardMagic, sizeof(kShardMagic)) == 0,
             "'{}' is not an xlme shard index (bad magic number); re-run xlme-data binarize",
             idx_path);
  XLME_CHECK(header_.version == kShardVersion,
             "shard '{}' has format version {}, this build reads version {}; re-run xlme-data "
             "binarize",
             idx_path, header_.version, kShardVersion);
  XLME_CHECK(header_.dtype_bytes == 2 || header_.dtype_bytes == 4,
             "shard '{}' has an invalid dtype of {} bytes; re-run xlme-data binarize", idx_path,
             header_.dtype_bytes);
  const uint64_t documents =
      header_.kind == static_cast<uint32_t>(ShardKind::kMono) ? header_.documents + 1 : 0;
  const uint64_t payload = (header_.segments + 1 + documents) * sizeof(uint64_t);
  XLME_CHECK(idx_->size == sizeof(ShardHeader) + payload,
             "shard index '{}' is truncated or corrupt: expected {} bytes, found {}; re-run "
             "xlme-data binarize",
             idx_path, sizeof(ShardHeader) + payload, idx_->size);
  const uint64_t bin_bytes = header_.tokens * header_.dtype_bytes;
  XLME_CHECK(bin_->size == bin_bytes,
             "shard '{}' is truncated or corrupt: expected {} bytes ({} tokens), found {}; re-run "
             "xlme-data binarize",
             bin_path, bin_bytes, header_.tokens, bin_->size);
  offsets_ = reinterpret_cast<const uint64_t*>(idx_->data + sizeof(ShardHeader));
  documents_ = offsets_ + header_.segments + 1;
  XLME_CHECK(offsets_[header_.segments] == header_.tokens,
             "shard index '{}' is corrupt: its last offset is {}, the shard has {} tokens; re-run "
             "xlme-data binarize",
             idx_path, offsets_[header_.segments], header_.tokens);
  if (verify_checksums) {
    const uint32_t idx_crc = crc32_update(0, offsets_, payload);
    XLME_CHECK(idx_crc == header_.index_crc32,
               "shard index '{}' is corrupt: CRC32 {:08x}, the header says {:08x}; re-run "
               "xlme-data binarize",
               idx_path, idx_crc, header_.index_crc32);
    const uint32_t bin_crc = crc32_update(0, bin_->data, bin_->size);
    XLME_CHECK(bin_crc == header_.bin_crc32,
               "shard '{}' is corrupt: CRC32 {:08x}, its index says {:08x}; re-run xlme-data "
               "binarize",
               bin_path, bin_crc, header_.bin_crc32);
  }
}

Shard::~Shard() = default;

void Shard::append_segment(int64_t i, std::vector<int32_t>& out) const {
  const uint64_t begin = offsets_[i], end = offsets_[i + 1];
  if (header_.dtype_bytes == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(bin_->data);
    out.insert(out.end(), p + begin, p + end);
  } else {
    const auto* p = reinterpret_cast<const int32_t*>(bin_->data);
    out.insert(out.end(), p + begin, p + end);
  }
}

void Shard::check_tokenizer(uint64_t hash, const std::string& tokenizer_path) const {
  XLME_CHECK(header_.tokenizer_hash == hash,
             "shard '{}.idx' was binarized with another tokenizer (hash {:016x}) than '{}' (hash "
             "{:016x}); re-run xlme-data binarize with this tokenizer or set data.tokenizer to "
             "the one it was made with",
             stem_, header_.tokenizer_hash, tokenizer_path, hash);
}

std::vector<std::string> list_shards(const std::string& dir) {
  std::vector<std::string> stems;
  for (const char* kind : {"mono", "para"}) {
    const auto sub = std::filesystem::path(dir) / kind;
    if (!std::filesystem::is_directory(sub)) continue;
    for (const auto& e : std::filesystem::directory_iterator(sub)) {
      if (e.path().extension() == ".idx") {
        stems.push_back((e.path().parent_path() / e.path().stem()).string());
      }
    }
  }
  std::sort(stems.begin(), stems.end());
  return stems;
}

void write_shard(const std::string& stem, ShardKind kind, const std::string& name,
                 const std::vector<std::vector<int32_t>>& segments,
                 const std::vector<int64_t>& document_starts, int64_t vocab_size,
                 uint64_t tokenizer_hash) {
  XLME_CHECK(kind == ShardKind::kMono || segments.size() % 2 == 0,
             "para shard '{}' needs an even number of segments (e, f per pair), got {}", stem,
             segments.size());
  ShardHeader header;
  std::memcpy(header.magic, kShardMagic, sizeof(kShardMagic));
  header.kind = static_cast<uint32_t>(kind);
  header.dtype_bytes = vocab_size <= 65536 ? 2 : 4;
  std::string bin, payload;
  uint64_t tokens = 0;
  for (const auto& segment : segments) {
    payload.append(reinterpret_cast<const char*>(&tokens), 8);
    for (const int32_t id : segment) {
      XLME_CHECK(id >= 0 && id < vocab_size, "token id {} of shard '{}' is outside [0, {})", id,
                 stem, vocab_size);
      if (header.dtype_bytes == 2) {
        const auto narrow = static_cast<uint16_t>(id);
        bin.append(reinterpret_cast<const char*>(&narrow), 2);
      } else {
        bin.append(reinterpret_cast<const char*>(&id), 4);
      }
    }
    tokens += segment.size();
  }
  payload.append(reinterpret_cast<const char*>(&tokens), 8);
  uint64_t documents = 0;
  if (kind == ShardKind::kMono) {
    std::vector<int64_t> starts = document_starts;
    if (starts.empty()) starts.push_back(0);
    for (const int64_t d : starts) {
      const auto start = static_cast<uint64_t>(d);
      payload.append(reinterpret_cast<const char*>(&start), 8);
    }
    const auto sentences = static_cast<uint64_t>(segments.size());
    payload.append(reinterpret_cast<const char*>(&sentences), 8);
    documents = starts.size();
  }
  header.bin_crc32 = crc32_update(0, bin.data(), bin.size());
  header.vocab_size = static_cast<uint64_t>(vocab_size);
  header.tokenizer_hash = tokenizer_hash;
  header.segments = segments.size();
  header.sequences = kind == ShardKind::kMono ? header.segments : header.segments / 2;
  header.tokens = tokens;
  header.documents = documents;
  header.source_lines = header.sequences;
  header.index_crc32 = crc32_update(0, payload.data(), payload.size());
  std::snprintf(header.name, sizeof(header.name), "%s", name.c_str());
  write_file_atomic(stem + ".bin", bin);
  write_file_atomic(stem + ".idx",
                    std::string(reinterpret_cast<const char*>(&header), sizeof(header)) + payload);
}

}  // namespace xlme::data
