// Binarized shards: one per language (mono) or language pair (para), memory-mapped.
//
//   <name>.bin  token ids, dtype uint16 (vocabulary <= 65536 ids) or int32, no header, so that
//               binarization can append to it and resume;
//   <name>.idx  a 256-byte ShardHeader, then uint64 offsets[segments + 1] into .bin (mono: a
//               segment is a sentence; para: segments alternate e, f, two per pair), then
//               (mono) uint64 document_starts[documents + 1], sentence indices.
// The header carries a magic number, the format version, the tokenizer's hash, counts and CRC32
// checksums of both files' payloads. Readers map the files and never copy a shard into memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace xlme::data {

constexpr char kShardMagic[8] = {'X', 'L', 'M', 'E', 'S', 'H', 'R', 'D'};
constexpr uint32_t kShardVersion = 1;

enum class ShardKind : uint32_t { kMono = 0, kPara = 1 };

struct ShardHeader {
  char magic[8];
  uint32_t version = kShardVersion;
  uint32_t kind = 0;         // ShardKind
  uint32_t dtype_bytes = 0;  // 2 = uint16, 4 = int32
  uint32_t bin_crc32 = 0;    // CRC32 of the whole .bin
  uint64_t vocab_size = 0;
  uint64_t tokenizer_hash = 0;    // Tokenizer::hash()
  uint64_t source_signature = 0;  // hash of the source files' paths, sizes and mtimes
  uint64_t sequences = 0;         // sentences (mono) or pairs (para)
  uint64_t segments = 0;          // sentences, or 2 x pairs
  uint64_t tokens = 0;
  uint64_t documents = 0;           // mono only
  uint64_t source_lines = 0;        // lines read (para: per side)
  uint64_t invalid_utf8_lines = 0;  // skipped
  uint64_t empty_lines = 0;         // skipped (para: pairs with an empty side; mono: not blank
                                    // separators but lines with no pieces)
  uint32_t index_crc32 = 0;         // CRC32 of the .idx payload after the header
  uint32_t reserved0 = 0;
  char name[64] = {};  // "de" or "en-de"
  char reserved[256 - 8 - 4 * 4 - 8 * 10 - 4 * 2 - 64] = {};
};
static_assert(sizeof(ShardHeader) == 256, "the shard header is 256 bytes on disk");

// A read-only, memory-mapped shard.
class Shard {
 public:
  // Maps <stem>.bin and <stem>.idx and checks the header, the sizes its counts imply (without
  // overflow) and that the offsets and document starts rise within the files (one pass over the
  // index); with `verify_checksums`, also the CRC32 of both payloads and that every token id is
  // below the vocabulary (reads every byte). Throws xlme::Error naming the file, the field or
  // byte, and what to do (re-run xlme-data binarize) on any mismatch.
  explicit Shard(const std::string& stem, bool verify_checksums = false);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const ShardHeader& header() const { return header_; }
  ShardKind kind() const { return static_cast<ShardKind>(header_.kind); }
  const std::string& stem() const { return stem_; }
  int64_t sequences() const { return static_cast<int64_t>(header_.sequences); }
  int64_t segments() const { return static_cast<int64_t>(header_.segments); }

  // Tokens of segment `i` (mono: sentence i; para: pair i / 2, side i % 2) appended to `out`.
  void append_segment(int64_t i, std::vector<int32_t>& out) const;
  int64_t segment_length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
  // Sentence index where document `d` starts (mono); document_start(documents) = sentences.
  int64_t document_start(int64_t d) const { return static_cast<int64_t>(documents_[d]); }
  // Whether a document starts at sentence `s` (mono): one of the document starts.
  bool starts_document(int64_t s) const;

  // Throws xlme::Error when the shard was made with another tokenizer than `hash`, naming both.
  void check_tokenizer(uint64_t hash, const std::string& tokenizer_path) const;

 private:
  int64_t token(uint64_t t) const;  // token t of the .bin, widened
  // Throws xlme::Error naming the shard, token t, its byte and segment, and the id `id`.
  [[noreturn]] void fail_token(uint64_t t, int64_t id) const;

  struct Mapping;
  std::string stem_;
  ShardHeader header_;
  std::unique_ptr<Mapping> bin_, idx_;
  const uint64_t* offsets_ = nullptr;
  const uint64_t* documents_ = nullptr;
};

// The shard stems (path without .idx) under `dir`/mono and `dir`/para, sorted.
std::vector<std::string> list_shards(const std::string& dir);

// Writes a shard held in memory (synthetic shards for xlme-data bench and tests; real corpora go
// through binarize, which streams): `segments` are sentences (mono) or alternating e, f (para),
// `document_starts` the sentence index of each document (mono; empty: one document).
void write_shard(const std::string& stem, ShardKind kind, const std::string& name,
                 const std::vector<std::vector<int32_t>>& segments,
                 const std::vector<int64_t>& document_starts, int64_t vocab_size,
                 uint64_t tokenizer_hash);

}  // namespace xlme::data
