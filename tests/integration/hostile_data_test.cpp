// Hostile shards: shard headers and indexes crafted to break the reader, run
// through `xlme-data inspect` and xlme-pretrain. Counts whose byte sizes wrap around 2^64, offsets
// and document starts that fall or leave the file, token ids past the vocabulary with valid
// checksums, a vocabulary larger than the model's, a name without its NUL, a FIFO or a folder in a
// shard file's place: each ends with exit code 1 (never a signal, never a hang) and a message that
// names the file and the field or byte.
#include "fault_fixtures.h"
#include "hostile_fixtures.h"

#include "xlme/common/checksum.h"
#include "xlme/data/shard.h"

#include <sys/stat.h>

#include <cstddef>
#include <cstring>
#include <functional>

namespace xlme {
namespace {

using testing::fails_cleanly;
using testing::HostileRun;
using testing::read_file;
using testing::run_hostile;
using testing::TempDir;
using testing::write_file;

// Tokens 4 .. 4 + 55 of the tiny model's 64 ids, `n` of them from `seed`.
std::vector<int32_t> hostile_sentence(int n, int seed) {
  std::vector<int32_t> s;
  for (int k = 0; k < n; ++k) s.push_back(4 + (seed * 7 + k * 13) % 56);
  return s;
}

// Valid shards for the tiny model (mono/de, para/en-de, vocabulary `vocab`), then crafted.
class HostileShards : public ::testing::Test {
 protected:
  void SetUp() override { write_shards(64); }

  void write_shards(int64_t vocab) {
    std::vector<std::vector<int32_t>> sentences, pairs;
    for (int i = 0; i < 40; ++i) sentences.push_back(hostile_sentence(5 + i % 6, i));
    for (int i = 0; i < 40; ++i) pairs.push_back(hostile_sentence(4 + i % 5, 100 + i));
    data::write_shard(mono(), data::ShardKind::kMono, "de", sentences, {0, 20}, vocab, 0);
    data::write_shard(para(), data::ShardKind::kPara, "en-de", pairs, {}, vocab, 0);
  }

  std::string shards() const { return dir_ / "shards"; }
  std::string mono() const { return dir_ / "shards/mono/de"; }
  std::string para() const { return dir_ / "shards/para/en-de"; }

  // Rewrites the header of `stem`.idx through `edit`.
  static void edit_header(const std::string& stem,
                          const std::function<void(data::ShardHeader&)>& edit) {
    std::string idx = read_file(stem + ".idx");
    data::ShardHeader header;
    std::memcpy(&header, idx.data(), sizeof(header));
    edit(header);
    std::memcpy(idx.data(), &header, sizeof(header));
    write_file(stem + ".idx", idx);
  }

  // Sets the 8-byte index entry `entry` (0 = the first offset) of `stem`.idx to `value`, with
  // the index checksum made to match, so that only the structure can give the crafting away.
  static void set_index_entry(const std::string& stem, uint64_t entry, uint64_t value) {
    std::string idx = read_file(stem + ".idx");
    const size_t at = sizeof(data::ShardHeader) + 8 * entry;
    std::memcpy(idx.data() + at, &value, 8);
    data::ShardHeader header;
    std::memcpy(&header, idx.data(), sizeof(header));
    header.index_crc32 = crc32_update(0, idx.data() + sizeof(header), idx.size() - sizeof(header));
    std::memcpy(idx.data(), &header, sizeof(header));
    write_file(stem + ".idx", idx);
  }

  HostileRun inspect() const {
    // `timeout`: a reader that blocks (on a FIFO) ends with 124 instead of hanging the test.
    return run_hostile("xlme-data", {"inspect", "--shards", shards()}, "timeout 300");
  }
  HostileRun pretrain() const {
    return run_hostile(
        "xlme-pretrain",
        testing::tiny_pretrain_args(dir_ / "run", 2, {"--set", "data.shards=" + shards()}),
        "timeout 300");
  }

  // Both binaries fail on the crafted shards with exit code 1, naming every one of `names`.
  void expect_both_fail(std::initializer_list<std::string> names) const {
    EXPECT_TRUE(fails_cleanly(inspect(), 1, names)) << "xlme-data inspect";
    EXPECT_TRUE(fails_cleanly(pretrain(), 1, names)) << "xlme-pretrain";
  }

  TempDir dir_;
};

// The crafting helpers leave valid shards valid: both binaries accept them.
TEST_F(HostileShards, UntouchedShardsPass) {
  const HostileRun r = inspect();
  EXPECT_TRUE(fails_cleanly(r, 0, {"2 shards verified"}));
  EXPECT_TRUE(fails_cleanly(pretrain(), 0, {}));
}

// Counts whose byte sizes wrap around 2^64 to the real file sizes (checked since 5319048: kept
// here with the training path, which read them unchecked before).
TEST_F(HostileShards, CountsThatWrapAroundAreRefused) {
  const std::string idx = mono() + ".idx", bin = mono() + ".bin";
  edit_header(mono(), [](data::ShardHeader& h) {
    h.segments += uint64_t{1} << 61;  // (segments + 1 + documents + 1) * 8 wraps to the same size
    h.sequences = h.segments;
  });
  expect_both_fail(
      {"shard index '" + idx + "' is truncated or corrupt", "which need more than 2^64 bytes"});
  write_shards(64);
  edit_header(mono(), [](data::ShardHeader& h) { h.documents += uint64_t{1} << 61; });
  expect_both_fail({"shard index '" + idx + "' is truncated or corrupt",
                    "2305843009213693954 documents", "which need more than 2^64 bytes"});
  write_shards(64);
  edit_header(mono(), [](data::ShardHeader& h) { h.tokens += uint64_t{1} << 63; });  // x 2 bytes
  expect_both_fail({"shard '" + bin + "' is truncated or corrupt: expected more than 2^64 bytes"});
  write_shards(64);
  edit_header(para(), [](data::ShardHeader& h) { h.sequences = uint64_t{1} << 63; });
  expect_both_fail({"shard index '" + para() +
                    ".idx' is corrupt: 9223372036854775808 sequences and "
                    "40 segments do not fit a para shard"});
}

// Offsets and document starts that fall back or point past the end (checked since 5319048).
TEST_F(HostileShards, OffsetsOutOfOrderOrPastTheEndAreRefused) {
  const std::string idx = mono() + ".idx";
  const uint64_t tokens = [&] {
    data::ShardHeader h;
    std::memcpy(&h, read_file(idx).data(), sizeof(h));
    return h.tokens;
  }();
  set_index_entry(mono(), 5, tokens + 1000);  // past the end of the .bin
  expect_both_fail({"shard index '" + idx + "' is corrupt: token offset 5 (byte " +
                    std::to_string(sizeof(data::ShardHeader) + 40) + ") is " +
                    std::to_string(tokens + 1000)});
  write_shards(64);
  set_index_entry(mono(), 5, 2);  // below offset 4
  expect_both_fail({"shard index '" + idx + "' is corrupt: token offset 5", ") is 2, after "});
  write_shards(64);
  set_index_entry(mono(), 0, 3);  // the first offset is not 0
  expect_both_fail({"shard index '" + idx + "' is corrupt: the first token offset", "is 3, not 0"});
  write_shards(64);
  set_index_entry(mono(), 41 + 1, 1000);  // document start 1 past the 40 sentences
  expect_both_fail({"shard index '" + idx + "' is corrupt: document start 1", "is 1000"});
}

// A token id past the vocabulary in a shard whose checksums match: inspect (which reads every
// byte) names the token, its byte and segment; training names it when it reads the segment.
TEST_F(HostileShards, TokenPastTheVocabularyWithValidChecksumsIsNamed) {
  std::string bin = read_file(mono() + ".bin");
  const uint16_t id = 64;
  std::memcpy(bin.data() + 2 * 7, &id, 2);  // token 7: sentence 1 (sentence 0 has 5 tokens)
  write_file(mono() + ".bin", bin);
  edit_header(mono(),
              [&](data::ShardHeader& h) { h.bin_crc32 = crc32_update(0, bin.data(), bin.size()); });
  EXPECT_TRUE(fails_cleanly(inspect(), 1,
                            {"shard '" + mono() +
                             ".bin' is corrupt: token 7 (byte 14, segment 1) is "
                             "64, outside the vocabulary of 64 ids"}));
  // Training without data.verify_shards: the check on every segment read, over enough steps to
  // read every sentence.
  EXPECT_TRUE(fails_cleanly(
      run_hostile("xlme-pretrain",
                  testing::tiny_pretrain_args(
                      dir_ / "run", 20,
                      {"--set", "data.shards=" + shards(), "--set", "train.save_every=100"}),
                  "timeout 300"),
      1, {"shard '" + mono() + ".bin' is corrupt: token 7 (byte 14, segment 1) is 64"}));
}

// Shards whose header says a vocabulary of 1000 ids (tokens up to 999 inside it) trained without a
// tokenizer by a model of 64 ids: refused at the start, naming the shard and both sizes, instead
// of an "index out of range" inside LibTorch (a device assert on a GPU) at the first batch.
TEST_F(HostileShards, VocabularyLargerThanTheModelsIsNamed) {
  std::vector<std::vector<int32_t>> sentences, pairs;
  for (int i = 0; i < 40; ++i) {
    sentences.push_back({5, 6, 900 + i, 7, 8});
    pairs.push_back({5, 999, 7, 8});
  }
  data::write_shard(mono(), data::ShardKind::kMono, "de", sentences, {}, 1000, 0);
  data::write_shard(para(), data::ShardKind::kPara, "en-de", pairs, {}, 1000, 0);
  EXPECT_TRUE(fails_cleanly(inspect(), 0, {"vocab 1000"}));  // valid shards in themselves
  EXPECT_TRUE(fails_cleanly(
      pretrain(), 1, {"shard '" + mono() + ".idx' has a vocabulary of 1000 ids, expected 64"}));
}

// Header fields that only inspect prints: a name without its NUL (read past the header) and
// documents counted in a para shard (which has none).
TEST_F(HostileShards, NameWithoutNulAndParaDocumentsAreRefused) {
  edit_header(mono(), [](data::ShardHeader& h) { std::memset(h.name, 'A', sizeof(h.name)); });
  EXPECT_TRUE(fails_cleanly(inspect(), 1,
                            {"shard index '" + mono() + ".idx' is corrupt: the name at byte " +
                             std::to_string(offsetof(data::ShardHeader, name)) +
                             " has no terminating NUL within its 64 bytes"}));
  write_shards(64);
  edit_header(para(), [](data::ShardHeader& h) { h.documents = uint64_t{1} << 62; });
  expect_both_fail({"shard index '" + para() +
                    ".idx' is corrupt: a para shard has no documents, "
                    "its header counts 4611686018427387904 (byte " +
                    std::to_string(offsetof(data::ShardHeader, documents)) + ")"});
}

// A FIFO in the index's place (opening it for reading waited for a writer forever) and a folder
// in the .bin's: named for what they are.
TEST_F(HostileShards, FifoOrFolderInAShardsPlaceIsNamed) {
  std::filesystem::remove(mono() + ".idx");
  ASSERT_EQ(::mkfifo((mono() + ".idx").c_str(), 0600), 0);
  expect_both_fail({"shard file '" + mono() + ".idx' is a FIFO (named pipe), not a regular file"});
  write_shards(64);
  std::filesystem::remove(para() + ".bin");
  std::filesystem::create_directory(para() + ".bin");
  expect_both_fail({"shard file '" + para() + ".bin' is a folder, not a regular file"});
}

}  // namespace
}  // namespace xlme
