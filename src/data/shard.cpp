#include "xlme/data/shard.h"

#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace xlme::data {

// A read-only mmap of a whole file (an empty file maps to nothing).
struct Shard::Mapping {
  const char* data = nullptr;
  size_t size = 0;

  explicit Mapping(const std::string& path) {
    // O_NONBLOCK: a FIFO in the shard's place opens without waiting for a writer, and is refused
    // below; regular files ignore the flag.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    XLME_CHECK(fd >= 0, "cannot open shard file '{}': {}; run xlme-data binarize", path,
               std::strerror(errno));
    struct stat st {};
    const bool stated = ::fstat(fd, &st) == 0;
    if (!stated || !S_ISREG(st.st_mode)) {
      const int error = errno;
      ::close(fd);
      XLME_CHECK(stated, "cannot read the size of shard file '{}': {}", path, std::strerror(error));
      XLME_FAIL("shard file '{}' is {}, not a regular file; run xlme-data binarize", path,
                file_type_name(st.st_mode));
    }
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
  XLME_CHECK(header_.kind == static_cast<uint32_t>(ShardKind::kMono) ||
                 header_.kind == static_cast<uint32_t>(ShardKind::kPara),
             "shard index '{}' is corrupt: kind {} at byte 12 is neither mono (0) nor para (1); "
             "re-run xlme-data binarize",
             idx_path, header_.kind);
  XLME_CHECK(header_.vocab_size > 0 && (header_.dtype_bytes == 4 || header_.vocab_size <= 65536),
             "shard index '{}' is corrupt: a vocabulary of {} ids cannot be stored in {} bytes "
             "per token; re-run xlme-data binarize",
             idx_path, header_.vocab_size, header_.dtype_bytes);
  XLME_CHECK(std::memchr(header_.name, '\0', sizeof(header_.name)) != nullptr,
             "shard index '{}' is corrupt: the name at byte {} has no terminating NUL within its "
             "{} bytes; re-run xlme-data binarize",
             idx_path, offsetof(ShardHeader, name), sizeof(header_.name));
  const bool mono = kind() == ShardKind::kMono;
  XLME_CHECK(mono || header_.documents == 0,
             "shard index '{}' is corrupt: a para shard has no documents, its header counts {} "
             "(byte {}); re-run xlme-data binarize",
             idx_path, header_.documents, offsetof(ShardHeader, documents));
  XLME_CHECK(mono ? header_.sequences == header_.segments
                  : header_.segments % 2 == 0 && header_.sequences == header_.segments / 2,
             "shard index '{}' is corrupt: {} sequences and {} segments do not fit a {} shard; "
             "re-run xlme-data binarize",
             idx_path, header_.sequences, header_.segments, mono ? "mono" : "para");
  // The header's counts decide the sizes of both files: computed without overflow, since a
  // damaged header can hold any number.
  uint64_t entries = 0, payload = 0, bin_bytes = 0;
  bool overflow = __builtin_add_overflow(header_.segments, uint64_t{1}, &entries);
  if (mono) {
    overflow = overflow || __builtin_add_overflow(entries, header_.documents, &entries) ||
               __builtin_add_overflow(entries, uint64_t{1}, &entries);
  }
  overflow = overflow || __builtin_mul_overflow(entries, uint64_t{8}, &payload);
  XLME_CHECK(!overflow && idx_->size - sizeof(ShardHeader) == payload,
             "shard index '{}' is truncated or corrupt: its header counts {} segments and {} "
             "documents, which need {} bytes after the header, the file has {}; re-run xlme-data "
             "binarize",
             idx_path, header_.segments, header_.documents,
             overflow ? std::string("more than 2^64") : std::to_string(payload),
             idx_->size - sizeof(ShardHeader));
  overflow = __builtin_mul_overflow(header_.tokens, uint64_t{header_.dtype_bytes}, &bin_bytes);
  XLME_CHECK(!overflow && bin_->size == bin_bytes,
             "shard '{}' is truncated or corrupt: expected {} bytes ({} tokens), found {}; re-run "
             "xlme-data binarize",
             bin_path, overflow ? std::string("more than 2^64") : std::to_string(bin_bytes),
             header_.tokens, bin_->size);
  offsets_ = reinterpret_cast<const uint64_t*>(idx_->data + sizeof(ShardHeader));
  documents_ = offsets_ + header_.segments + 1;
  // One pass over the index: offsets rise from 0 to the token count, document starts from 0 to
  // the sentence count, so that no read can leave the files.
  auto check_rising = [&](const uint64_t* values, uint64_t count, uint64_t last, const char* what) {
    const size_t first_byte =
        static_cast<size_t>(reinterpret_cast<const char*>(values) - idx_->data);
    XLME_CHECK(values[0] == 0,
               "shard index '{}' is corrupt: the first {} (byte {}) is {}, not 0; "
               "re-run xlme-data binarize",
               idx_path, what, first_byte, values[0]);
    for (uint64_t i = 1; i < count; ++i) {
      XLME_CHECK(values[i] >= values[i - 1] && values[i] <= last,
                 "shard index '{}' is corrupt: {} {} (byte {}) is {}, after {} (the end is {}); "
                 "re-run xlme-data binarize",
                 idx_path, what, i, first_byte + 8 * i, values[i], values[i - 1], last);
    }
    XLME_CHECK(values[count - 1] == last,
               "shard index '{}' is corrupt: the last {} (byte {}) is {}, the shard has {}; re-run "
               "xlme-data binarize",
               idx_path, what, first_byte + 8 * (count - 1), values[count - 1], last);
  };
  check_rising(offsets_, header_.segments + 1, header_.tokens, "token offset");
  if (mono) check_rising(documents_, header_.documents + 1, header_.segments, "document start");
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
    // The same full read checks every token against the vocabulary: a shard crafted with valid
    // checksums but ids past the embedding table is refused here, not at the first batch.
    const auto vocab = static_cast<int64_t>(header_.vocab_size);
    for (uint64_t t = 0; t < header_.tokens; ++t) {
      const int64_t id = token(t);
      if (id < 0 || id >= vocab) fail_token(t, id);
    }
  }
}

Shard::~Shard() = default;

int64_t Shard::token(uint64_t t) const {
  if (header_.dtype_bytes == 2) return reinterpret_cast<const uint16_t*>(bin_->data)[t];
  return reinterpret_cast<const int32_t*>(bin_->data)[t];
}

void Shard::fail_token(uint64_t t, int64_t id) const {
  // The segment holding token t: the last offset <= t (offsets rise, checked on open).
  const uint64_t* after = std::upper_bound(offsets_, offsets_ + header_.segments + 1, t);
  XLME_FAIL(
      "shard '{}.bin' is corrupt: token {} (byte {}, segment {}) is {}, outside the vocabulary "
      "of {} ids; re-run xlme-data binarize (xlme-data inspect checks every shard)",
      stem_, t, t * header_.dtype_bytes, after - offsets_ - 1, id, header_.vocab_size);
}

void Shard::append_segment(int64_t i, std::vector<int32_t>& out) const {
  const uint64_t begin = offsets_[i], end = offsets_[i + 1];
  const size_t first = out.size();
  if (header_.dtype_bytes == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(bin_->data);
    out.insert(out.end(), p + begin, p + end);
  } else {
    const auto* p = reinterpret_cast<const int32_t*>(bin_->data);
    out.insert(out.end(), p + begin, p + end);
  }
  const auto vocab = static_cast<int64_t>(header_.vocab_size);
  for (size_t k = first; k < out.size(); ++k) {
    if (out[k] < 0 || out[k] >= vocab) fail_token(begin + (k - first), out[k]);
  }
}

bool Shard::starts_document(int64_t s) const {
  const uint64_t* end = documents_ + header_.documents + 1;
  return std::binary_search(documents_, end, static_cast<uint64_t>(s));
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
    // (stem, the file that shows the shard was begun)
    std::vector<std::pair<std::string, std::string>> unfinished;
    const std::string partial = ".bin.partial";
    for (const auto& e : std::filesystem::directory_iterator(sub)) {
      const std::string name = e.path().filename().string();
      const std::string folder = e.path().parent_path().string() + "/";
      if (e.path().extension() == ".idx") {
        stems.push_back((e.path().parent_path() / e.path().stem()).string());
      } else if (e.path().extension() == ".progress") {
        unfinished.emplace_back(folder + e.path().stem().string(), e.path().string());
      } else if (name.size() > partial.size() &&
                 name.compare(name.size() - partial.size(), partial.size(), partial) == 0) {
        unfinished.emplace_back(folder + name.substr(0, name.size() - partial.size()),
                                e.path().string());
      }
    }
    // A shard whose binarize was stopped has its .partial files (and, after its first progress
    // record, its .progress) but no .idx yet: listing only the .idx files would leave its
    // language out of training without a word.
    for (const auto& [stem, begun] : unfinished) {
      XLME_CHECK(std::filesystem::exists(stem + ".idx"),
                 "shard '{}' is unfinished: '{}' is there but '{}.idx' is not (xlme-data "
                 "binarize was stopped before it finished), and its {} '{}' would be missing from "
                 "training; run xlme-data binarize again (it resumes), or remove '{}.*' to go on "
                 "without it",
                 stem, begun, stem, std::string(kind) == "mono" ? "language" : "language pair",
                 std::filesystem::path(stem).filename().string(), stem);
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
