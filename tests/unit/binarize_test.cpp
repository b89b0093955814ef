// Binarization against a naive reference (Tokenizer::encode line by line), across .txt/.gz/.xz,
// thread counts, interruption and resume, and every bad input: mismatched parallel files,
// languages without data, corrupt or truncated shards, another tokenizer.
#include "xlme/data/binarize.h"

#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace xlme::data {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// Sentences in two scripts with blank-line document breaks, one invalid UTF-8 line.
std::string mono_text(int lines, unsigned seed) {
  const char* const words[] = {"the",  "house", "green", "Haus",  "grün", "дом",
                               "река", "вода",  "small", "Licht", "über", "и"};
  std::ostringstream out;
  unsigned state = seed;
  for (int i = 0; i < lines; ++i) {
    if (i % 9 == 8) out << "\n";
    if (i == 13) out << "bad \xff\xfe bytes\n";
    const int n = 2 + i % 6;
    for (int w = 0; w < n; ++w) {
      state = state * 1103515245u + 12345u;
      out << (w ? " " : "") << words[(state >> 16) % 12];
    }
    out << "\n";
  }
  return out.str();
}

std::vector<std::string> text_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class Binarize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      write_file(*dir_ / "train.txt", mono_text(300, 5));
      const std::string command = "spm_train --input=" + (*dir_ / "train.txt") +
                                  " --model_prefix=" + (*dir_ / "m") +
                                  " --vocab_size=40 --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3";
      xlme::testing::run_or_throw(command, *dir_ / "train.log");
      tokenizer_ = new Tokenizer(*dir_ / "m.model", VocabLayout::kOwn);
    });
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete dir_;
  }
  inline static xlme::testing::SuiteSetUp setup_;
  void SetUp() override { setup_.check(); }

  BinarizeOptions options(const TempDir& dir) const {
    BinarizeOptions o;
    o.input_dir = dir / "raw";
    o.out_dir = dir / "shards";
    o.threads = 3;
    o.chunk_lines = 7;
    o.max_invalid_fraction = 0.05;  // the fixtures hold one invalid line in 56 to 112
    return o;
  }

  // The reference: every non-blank, valid line encoded, in order.
  static void expect_mono_shard(const std::string& stem, const std::string& text) {
    const Shard shard(stem, /*verify_checksums=*/true);
    std::vector<std::vector<int32_t>> expected;
    std::vector<int64_t> doc_starts;
    bool in_doc = false;
    for (const auto& line : text_lines(text)) {
      if (line.empty()) {
        in_doc = false;
        continue;
      }
      if (line.find('\xff') != std::string::npos) continue;
      if (!in_doc) doc_starts.push_back(static_cast<int64_t>(expected.size()));
      in_doc = true;
      expected.push_back(tokenizer_->encode(line));
    }
    ASSERT_EQ(shard.sequences(), static_cast<int64_t>(expected.size()));
    for (int64_t i = 0; i < shard.sequences(); ++i) {
      std::vector<int32_t> ids;
      shard.append_segment(i, ids);
      EXPECT_EQ(ids, expected[i]) << i;
    }
    ASSERT_EQ(shard.header().documents, doc_starts.size());
    for (size_t d = 0; d < doc_starts.size(); ++d)
      EXPECT_EQ(shard.document_start(d), doc_starts[d]);
    EXPECT_EQ(shard.document_start(doc_starts.size()), shard.sequences());
    EXPECT_EQ(shard.header().invalid_utf8_lines, 1u);
    EXPECT_EQ(shard.header().dtype_bytes, 2u);
    EXPECT_EQ(shard.header().vocab_size, 41u);
    EXPECT_EQ(shard.header().tokenizer_hash, tokenizer_->hash());
  }

  static TempDir* dir_;
  static Tokenizer* tokenizer_;
};
TempDir* Binarize::dir_ = nullptr;
Tokenizer* Binarize::tokenizer_ = nullptr;

TEST_F(Binarize, MonoFromTxtGzAndXzMatchesLineByLineEncoding) {
  TempDir dir;
  const std::string de = mono_text(100, 1), ru = mono_text(80, 2), el = mono_text(60, 3);
  write_file(dir / "raw/mono/de.txt", de);
  write_file(dir / "raw/mono/ru.txt", ru);
  write_file(dir / "raw/mono/el.txt", el);
  ASSERT_EQ(std::system(("gzip " + (dir / "raw/mono/ru.txt")).c_str()), 0);
  ASSERT_EQ(std::system(("xz " + (dir / "raw/mono/el.txt")).c_str()), 0);
  const auto reports = binarize(options(dir), *tokenizer_);
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].name, "de");
  EXPECT_EQ(reports[0].invalid_utf8_lines, 1);
  expect_mono_shard(dir / "shards/mono/de", de);
  expect_mono_shard(dir / "shards/mono/ru", ru);
  expect_mono_shard(dir / "shards/mono/el", el);
  EXPECT_EQ(list_shards(dir / "shards").size(), 3u);

  // One thread and one big chunk write the same bytes.
  auto single = options(dir);
  single.out_dir = dir / "single";
  single.threads = 1;
  single.chunk_lines = 100000;
  binarize(single, *tokenizer_);
  EXPECT_EQ(read_file(dir / "single/mono/de.bin"), read_file(dir / "shards/mono/de.bin"));
  EXPECT_EQ(read_file(dir / "single/mono/de.idx"), read_file(dir / "shards/mono/de.idx"));

  // A second run finds the shards up to date; inspect decodes them back.
  EXPECT_TRUE(binarize(options(dir), *tokenizer_)[0].up_to_date);
  const auto summaries = inspect_shards(dir / "shards", tokenizer_, 20);
  ASSERT_EQ(summaries.size(), 3u);
  EXPECT_GT(summaries[0].checked_segments, 0);
}

TEST_F(Binarize, InterruptedRunResumesToTheSameShard) {
  TempDir dir;
  const std::string text = mono_text(200, 7);
  write_file(dir / "raw/mono/de.txt", text);
  auto o = options(dir);
  o.max_chunks = 4;
  auto r = binarize(o, *tokenizer_);
  EXPECT_FALSE(r[0].finished);
  EXPECT_FALSE(std::filesystem::exists(dir / "shards/mono/de.idx"));
  EXPECT_TRUE(std::filesystem::exists(dir / "shards/mono/de.progress"));
  r = binarize(o, *tokenizer_);  // four more chunks
  EXPECT_TRUE(r[0].resumed);
  EXPECT_FALSE(r[0].finished);
  o.max_chunks = 0;
  r = binarize(o, *tokenizer_);
  EXPECT_TRUE(r[0].resumed);
  EXPECT_TRUE(r[0].finished);
  EXPECT_FALSE(std::filesystem::exists(dir / "shards/mono/de.progress"));
  expect_mono_shard(dir / "shards/mono/de", text);
  auto whole = options(dir);
  whole.out_dir = dir / "whole";
  binarize(whole, *tokenizer_);
  EXPECT_EQ(read_file(dir / "whole/mono/de.bin"), read_file(dir / "shards/mono/de.bin"));
  EXPECT_EQ(read_file(dir / "whole/mono/de.idx"), read_file(dir / "shards/mono/de.idx"));
}

TEST_F(Binarize, ParallelPairsAndMismatchedLineCounts) {
  TempDir dir;
  write_file(dir / "raw/para/en-de.en", "the green house\nsmall\n\nthe river\n");
  write_file(dir / "raw/para/en-de.de", "das grüne Haus\nklein\nleer\nder Fluss\n");
  const auto reports = binarize(options(dir), *tokenizer_);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].sequences, 3);
  EXPECT_EQ(reports[0].empty_lines, 1);
  const Shard shard(dir / "shards/para/en-de", true);
  EXPECT_EQ(shard.kind(), ShardKind::kPara);
  ASSERT_EQ(shard.segments(), 6);
  std::vector<int32_t> ids;
  shard.append_segment(4, ids);
  EXPECT_EQ(ids, tokenizer_->encode("the river"));
  ids.clear();
  shard.append_segment(5, ids);
  EXPECT_EQ(ids, tokenizer_->encode("der Fluss"));

  write_file(dir / "raw/para/en-ru.en", "one\ntwo\nthree\n");
  write_file(dir / "raw/para/en-ru.ru", "один\nдва\n");
  EXPECT_TRUE(contains_all(error_message([&] { binarize(options(dir), *tokenizer_); }),
                           {"parallel files '" + (dir / "raw/para/en-ru.en") + "' (3 lines) and '" +
                            (dir / "raw/para/en-ru.ru") +
                            "' (2 lines) have different line "
                            "counts"}));
  std::filesystem::remove(dir / "raw/para/en-ru.ru");
  EXPECT_TRUE(contains_all(error_message([&] { binarize(options(dir), *tokenizer_); }),
                           {"pair 'en-ru' has only one side"}));
  std::filesystem::remove(dir / "raw/para/en-ru.en");
  auto o = options(dir);
  o.para_pairs = {"en-de", "en-fr"};
  EXPECT_TRUE(contains_all(error_message([&] { binarize(o, *tokenizer_); }),
                           {"language pair 'en-fr' has no data", "data.para.languages"}));
}

TEST_F(Binarize, MissingFoldersAndLanguagesWithoutData) {
  TempDir dir;
  EXPECT_TRUE(contains_all(error_message([&] { binarize(options(dir), *tokenizer_); }),
                           {"corpus folder '" + (dir / "raw") + "' not found"}));
  std::filesystem::create_directories(dir / "raw");
  EXPECT_TRUE(contains_all(error_message([&] { binarize(options(dir), *tokenizer_); }),
                           {"has neither mono/ nor para/"}));
  write_file(dir / "raw/mono/de.txt", "\n\n\xff\xfe\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { binarize(options(dir), *tokenizer_); }),
                   {"'" + (dir / "raw/mono/de.txt") + "' is not UTF-8 text: 1 of 3 lines"}));
  BinarizeOptions lenient = options(dir);
  lenient.max_invalid_fraction = 1;
  EXPECT_TRUE(contains_all(error_message([&] { binarize(lenient, *tokenizer_); }),
                           {"language 'de' has no data", "3 lines read, 1 with invalid UTF-8"}));
  EXPECT_TRUE(contains_all(error_message([&] { inspect_shards(dir / "none", nullptr, 1); }),
                           {"shard folder '" + (dir / "none") + "' not found"}));
  EXPECT_TRUE(contains_all(error_message([&] { inspect_shards(dir / "raw", nullptr, 1); }),
                           {"has no mono/*.idx or para/*.idx shards"}));
}

TEST_F(Binarize, CorruptTruncatedAndForeignShardsAreCaught) {
  TempDir dir;
  write_file(dir / "raw/mono/de.txt", mono_text(50, 9));
  binarize(options(dir), *tokenizer_);
  const std::string stem = dir / "shards/mono/de";
  const std::string bin = read_file(stem + ".bin");

  std::string flipped = bin;
  flipped[bin.size() / 2] ^= 0x01;
  write_file(stem + ".bin", flipped);
  EXPECT_NO_THROW(Shard(stem, /*verify_checksums=*/false));  // sizes still agree
  EXPECT_TRUE(
      contains_all(error_message([&] { Shard(stem, true); }),
                   {"shard '" + stem + ".bin' is corrupt: CRC32", "re-run xlme-data binarize"}));
  EXPECT_TRUE(contains_all(error_message([&] { inspect_shards(dir / "shards", nullptr, 1); }),
                           {"is corrupt: CRC32"}));

  write_file(stem + ".bin", bin.substr(0, bin.size() - 6));
  EXPECT_TRUE(contains_all(error_message([&] { Shard(stem, false); }),
                           {"shard '" + stem + ".bin' is truncated or corrupt: expected " +
                            std::to_string(bin.size()) + " bytes"}));
  write_file(stem + ".bin", bin);
  const std::string idx = read_file(stem + ".idx");
  write_file(stem + ".idx", idx.substr(0, 100));
  EXPECT_TRUE(contains_all(error_message([&] { Shard(stem, false); }),
                           {"shard index '" + stem + ".idx' is truncated: 100 bytes"}));
  std::string bad_idx = idx;
  bad_idx[sizeof(ShardHeader) + 8] ^= 0x01;
  write_file(stem + ".idx", bad_idx);
  EXPECT_TRUE(contains_all(error_message([&] { Shard(stem, true); }),
                           {"shard index '" + stem + ".idx' is corrupt: CRC32"}));
  write_file(stem + ".idx", idx);

  const Shard shard(stem, true);
  EXPECT_TRUE(contains_all(
      error_message([&] { shard.check_tokenizer(42, "other.model"); }),
      {"shard '" + stem + ".idx' was binarized with another tokenizer", "than 'other.model'"}));
}

}  // namespace
}  // namespace xlme::data
