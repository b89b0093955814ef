// Damaged and hostile data as a user meets it: truncated and fake
// compressed files, UTF-16 text, a huge line, shards with flipped bytes and crafted headers. Each
// case makes the fault, runs xlme-data, and checks the exit code, that the message names the file
// and the offset or field, and that the shards the user had are untouched.
#include "fault_fixtures.h"
#include "test_util.h"

#include "xlme/data/shard.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

namespace xlme {
namespace {

using xlme::testing::contains_all;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

xlme::testing::ToolRun run_data_tool(const std::vector<std::string>& args) {
  return xlme::testing::run_tool("xlme-data", args);
}

// `lines` lines of pseudo-words over a 12-letter alphabet (blank line every 10th).
std::string fault_corpus_text(int lines, unsigned seed) {
  std::string text;
  unsigned state = seed;
  for (int i = 0; i < lines; ++i) {
    for (int w = 0; w < 5; ++w) {
      for (int c = 0; c < 4; ++c) {
        state = state * 1103515245u + 12345u;
        text += static_cast<char>('a' + (state >> 16) % 12);
      }
      text += ' ';
    }
    text += i % 10 == 9 ? "\n\n" : "\n";
  }
  return text;
}

// A raw corpus (mono/xx.txt, para/en-xx.{en,xx}), a SentencePiece model trained on it, and its
// shards binarized once: what a user has before the fault.
class DataFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(dir_ / "raw/mono/xx.txt", fault_corpus_text(300, 3));
    write_file(dir_ / "raw/para/en-xx.en", fault_corpus_text(100, 5));
    write_file(dir_ / "raw/para/en-xx.xx", fault_corpus_text(100, 7));
    const std::string train = "spm_train --input=" + (dir_ / "raw/mono/xx.txt") +
                              " --model_prefix=" + (dir_ / "m") +
                              " --vocab_size=60 --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3 "
                              ">/dev/null 2>&1";
    ASSERT_EQ(std::system(train.c_str()), 0);
    const auto r = binarize({});
    ASSERT_EQ(r.code, 0) << r.err;
  }

  xlme::testing::ToolRun binarize(const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"binarize",      "--input", dir_ / "raw", "--out",
                                     dir_ / "shards", "--set",   tokenizer()};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    return run_data_tool(args);
  }
  std::string tokenizer() const { return "data.tokenizer=" + (dir_ / "m.model"); }
  // xlme-pretrain of the tiny model on the shards, validating on dir_/heldout at start, into
  // dir_/`run`.
  std::vector<std::string> heldout_run_args(const std::string& run) const {
    return xlme::testing::tiny_pretrain_args(
        dir_ / run, 1,
        {"--set", tokenizer(), "--set", "model.vocab_size=0", "--set",
         "data.shards=" + (dir_ / "shards"), "--set", "data.heldout.dir=" + (dir_ / "heldout"),
         "--set", "train.validate_every=1", "--set", "train.validate_at_start=true"});
  }
  std::string shard_files() const {
    return read_file(dir_ / "shards/mono/xx.idx") + read_file(dir_ / "shards/mono/xx.bin");
  }

  TempDir dir_;
};

TEST_F(DataFaults, TruncatedGzipFailsNamingTheFileAndByteOffsetAndKeepsTheShard) {
  const std::string before = shard_files();
  write_file(dir_ / "big.txt", fault_corpus_text(2000, 11));
  ASSERT_EQ(std::system(("gzip -c " + (dir_ / "big.txt") + " > " + (dir_ / "big.gz")).c_str()), 0);
  const std::string gz = read_file(dir_ / "big.gz");
  const size_t cut = gz.size() * 6 / 10;
  std::filesystem::remove(dir_ / "raw/mono/xx.txt");
  write_file(dir_ / "raw/mono/xx.txt.gz", gz.substr(0, cut));
  auto r = binarize({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(
      contains_all(r.err, {"'" + (dir_ / "raw/mono/xx.txt.gz") + "' is truncated",
                           "stops at byte " + std::to_string(cut) + " of " + std::to_string(cut)}));
  EXPECT_EQ(shard_files(), before);

  // Plain text behind a .gz name is not read as if it were the decompressed data.
  write_file(dir_ / "raw/mono/xx.txt.gz", fault_corpus_text(50, 13));
  r = binarize({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"'" + (dir_ / "raw/mono/xx.txt.gz") + "' is not gzip data"}));
  EXPECT_EQ(shard_files(), before);
}

// A .gz of several members (cat a.gz b.gz) is read whole; a damaged later member, or bytes after
// the last member, are an error naming the file and the member, not a corpus silently cut at the
// first member (gzread stopped there with no error: 546 of 1,000 sentences kept).
TEST_F(DataFaults, EveryGzipMemberIsReadAndADamagedOneFails) {
  const std::string text1 = fault_corpus_text(300, 21), text2 = fault_corpus_text(300, 22);
  const auto gzip = [&](const std::string& name, const std::string& text) {
    write_file(dir_ / name, text);
    EXPECT_EQ(std::system(("gzip -c " + (dir_ / name) + " > " + (dir_ / name) + ".gz").c_str()), 0);
    return read_file(dir_ / (name + ".gz"));
  };
  const std::string first = gzip("first.txt", text1), second = gzip("second.txt", text2);
  // The token ids and the offsets (the index past its 256-byte header, which records the
  // source's path and times).
  const auto payload = [&] {
    return read_file(dir_ / "shards/mono/xx.idx").substr(256) +
           read_file(dir_ / "shards/mono/xx.bin");
  };
  // The shards of the same text, uncompressed.
  write_file(dir_ / "raw/mono/xx.txt", text1 + text2);
  auto r = binarize({});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string plain = payload();
  std::filesystem::remove(dir_ / "raw/mono/xx.txt");
  write_file(dir_ / "raw/mono/xx.txt.gz", first + second);
  r = binarize({});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(payload() == plain) << "both members, every sentence";
  const std::string gz_files = shard_files();

  std::string damaged = second;
  damaged[damaged.size() / 2] = static_cast<char>(damaged[damaged.size() / 2] ^ 0x55);
  write_file(dir_ / "raw/mono/xx.txt.gz", first + damaged);
  r = binarize({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"'" + (dir_ / "raw/mono/xx.txt.gz") + "'", "member 2"}))
      << r.err;
  EXPECT_TRUE(shard_files() == gz_files) << "the shard is kept";

  write_file(dir_ / "raw/mono/xx.txt.gz", first + "trailing bytes\n");
  r = binarize({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"'" + (dir_ / "raw/mono/xx.txt.gz") +
                                       "' has 15 bytes after its gzip member 1 (which ends at "
                                       "byte " +
                                       std::to_string(first.size()),
                                   "not another gzip member"}))
      << r.err;
  EXPECT_TRUE(shard_files() == gz_files) << "the shard is kept";
}

TEST_F(DataFaults, Utf16TextFailsAboveTheInvalidFractionAndFewBadLinesWarn) {
  const std::string before = shard_files();
  const std::string text = fault_corpus_text(300, 3);
  std::string utf16 = "\xff\xfe";
  for (const char c : text) utf16 += std::string{c, '\0'};
  write_file(dir_ / "raw/mono/xx.txt", utf16);
  auto r = binarize({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"'" + (dir_ / "raw/mono/xx.txt") + "' is not UTF-8 text",
                                   "data.binarize.max_invalid_fraction = 0.01", "NUL bytes"}));
  EXPECT_EQ(shard_files(), before);

  // Two bad lines (invalid UTF-8, a NUL) in 330: skipped with a warning, and they fail under a
  // stricter threshold.
  const std::string mixed = std::string("caf\xe9 au lait\n") + std::string("nul\0byte\n", 9) + text;
  write_file(dir_ / "raw/mono/xx.txt", mixed);
  r = binarize({});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"skipped 2 of 332 lines: 1 with invalid UTF-8, 1 with NUL"}));
  write_file(dir_ / "raw/mono/xx.txt", mixed + "\n");
  r = binarize({"data.binarize.max_invalid_fraction=0.001"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"2 of 333 lines have invalid UTF-8 (1) or NUL bytes (1)"}));
}

TEST_F(DataFaults, HugeLineIsSkippedUnreadAndCounted) {
  std::string text = fault_corpus_text(300, 3);
  text.insert(0, std::string(5 << 20, 'a') + "\n");
  write_file(dir_ / "raw/mono/xx.txt", text);
  const auto r = binarize({"data.binarize.max_line_bytes=65536"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"skipped 1 lines longer than 65536 bytes",
                                   "xx           mono 331 lines -> 300 sentences", "1 too long"}));
  const data::Shard shard(dir_ / "shards/mono/xx");
  EXPECT_EQ(shard.sequences(), 300);
}

// binarize's memory is flat in the number of lines: its index (8 bytes a sentence) is not read
// back whole and copied at the end, so the peaks of 4M one-word lines and of 4k of them differ by
// less than the 31 MB index itself (a copy would add about three times the index).
TEST_F(DataFaults, BinarizeMemoryIsFlatInTheNumberOfLines) {
  const auto corpus = [&](const std::string& folder, int64_t lines) {
    std::string text;
    text.reserve(static_cast<size_t>(lines) * 3);
    for (int64_t i = 0; i < lines; ++i) text += i % 2 == 0 ? "ab\n" : "cd\n";
    write_file(dir_ / (folder + "/mono/xx.txt"), text);
  };
  const auto peak = [&](const std::string& folder) {
    const auto r = xlme::testing::run_tool_measured(
        "xlme-data", {"binarize", "--input", dir_ / folder, "--out", dir_ / (folder + "-shards"),
                      "--set", tokenizer(), "--set", "run.threads=1"});
    EXPECT_EQ(r.code, 0) << r.err;
    return r.peak_rss_kib;
  };
  const int64_t lines = 4'000'000;
  corpus("few", 4'000);
  corpus("many", lines);
  const int64_t few = peak("few"), many = peak("many");
  const data::Shard shard(dir_ / "many-shards/mono/xx", /*verify_checksums=*/true);
  EXPECT_EQ(shard.segments(), lines);
  const int64_t index_kib = lines * 8 / 1024;
  EXPECT_LT(many - few, index_kib) << "peak RSS " << few << " KiB for 4k lines, " << many
                                   << " KiB for 4M lines (index: " << index_kib << " KiB)";
}

// A mono/en.txt that is a dangling link (an unmounted file system), a FIFO, a folder or
// /dev/zero, or a para file that is a dangling link, is not skipped (exit 0 and English absent
// from training): each is an error naming the file and the language; the shards the user had are
// untouched.
TEST_F(DataFaults, CorpusFilesThatAreNotRegularFilesAreNamedNotSkipped) {
  const std::string before = shard_files();
  const std::string en = dir_ / "raw/mono/en.txt";
  const auto fails = [&](const std::function<void()>& make, const std::string& file,
                         const std::vector<std::string>& words) {
    make();
    const auto r = binarize({});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(contains_all(r.err, {"corpus file '" + file + "'"})) << r.err;
    for (const auto& w : words) EXPECT_TRUE(contains_all(r.err, {w})) << r.err;
    std::filesystem::remove_all(file);
    EXPECT_EQ(shard_files(), before);
  };
  fails([&] { std::filesystem::create_symlink(dir_ / "unmounted/en.txt", en); }, en,
        {"which does not exist (an unmounted file system?)", "language 'en'"});
  fails([&] { ASSERT_EQ(::mkfifo(en.c_str(), 0644), 0); }, en,
        {"is a FIFO (named pipe), not a regular file", "language 'en' would be missing"});
  fails([&] { std::filesystem::create_directories(en); }, en, {"is a folder"});
  fails([&] { std::filesystem::create_symlink("/dev/zero", en); }, en, {"is a character device"});
  const std::string para = dir_ / "raw/para/en-yy.yy";
  write_file(dir_ / "raw/para/en-yy.en", "hello\n");
  fails([&] { std::filesystem::create_symlink(dir_ / "unmounted/en-yy.yy", para); }, para,
        {"language 'en-yy' would be missing"});
  std::filesystem::remove(dir_ / "raw/para/en-yy.en");
  // Names that are not language codes: they became languages ("e n", "-rf") or vanished ("..txt").
  for (const std::string name : {"e n", "-rf", "."}) {
    const std::string file = dir_ / ("raw/mono/" + name + ".txt");
    fails([&] { write_file(file, "hello\n"); }, file,
          {"'" + name + "' is not a language code", "rename the file"});
  }
}

// A shard whose binarize was killed (its .progress and .partial files, or only the .partial
// files when it was killed before its first progress record) was skipped by the reader; it is an
// error naming the shard and what to do.
TEST_F(DataFaults, UnfinishedShardIsNamedNotSkipped) {
  write_file(dir_ / "shards/para/en-de.bin.partial", std::string(64, '\0'));
  for (const bool with_progress : {false, true}) {
    if (with_progress) write_file(dir_ / "shards/para/en-de.progress", "source_signature 1\n");
    const auto r = run_data_tool({"inspect", "--shards", dir_ / "shards"});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(contains_all(r.err, {"shard '" + (dir_ / "shards/para/en-de") + "' is unfinished",
                                     "language pair 'en-de' would be missing from training",
                                     "run xlme-data binarize again (it resumes)"}))
        << with_progress << "\n"
        << r.err;
  }
}

// An edit that keeps the file's size, with its old mtime put back (touch -d, cp -p), is not
// "up to date": the shard gets the new text.
TEST_F(DataFaults, SameSizeEditWithTheOldMtimeIsBinarizedAgain) {
  const std::string file = dir_ / "raw/mono/xx.txt";
  const auto mtime = std::filesystem::last_write_time(file);
  std::string text = read_file(file);
  text[0] = text[0] == 'a' ? 'b' : 'a';
  write_file(file, text);
  std::filesystem::last_write_time(file, mtime);
  const std::string before = shard_files();
  const auto r = binarize({});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(shard_files(), before);
  EXPECT_EQ(r.err.find("xx           up to date"), std::string::npos) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"en-xx        up to date"})) << r.err;  // the pair: unchanged
}

// A file with CR-only line ends (classic Mac OS) would read as one line, cut to max_len (or,
// longer than data.binarize.max_line_bytes, skipped as "too long"): the language would have one
// sentence or none. Every corpus reader refuses it naming the file and the conversion; CRLF is
// read as before, and a byte-order mark at the start is dropped as the fine-tuning readers drop it.
// A file that switches to CR line ends after its fifth line was read as 6 lines, the rest joined
// into one and cut; now the line where it switches is named. A single carriage return inside a
// line (a stray one) is kept, with a warning naming the line and a count at the end.
TEST_F(DataFaults, CrLineEndsPastTheFirstLineAreNamedAndAStrayCrWarns) {
  const std::string before = shard_files();
  const std::string file = dir_ / "raw/mono/xx.txt";
  const std::string text = fault_corpus_text(300, 3);
  size_t fifth = 0;
  for (int i = 0; i < 5; ++i) fifth = text.find('\n', fifth) + 1;
  std::string switched = text;
  std::replace(switched.begin() + static_cast<std::ptrdiff_t>(fifth), switched.end(), '\n', '\r');
  write_file(file, switched);
  auto r = binarize({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"'" + file + "' line 6 holds", "carriage returns",
                                   "lines end in CR alone", "tr '\\r' '\\n' < FILE"}))
      << r.err;
  EXPECT_EQ(shard_files(), before);

  std::string stray = text;
  stray.insert(stray.find('\n', fifth), "\r tail");  // inside line 6, not its end
  write_file(file, stray);
  r = binarize({});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(
      r.err, {file + ":6: a carriage return (\\r) inside the line", "'" + file + "': 1 of "}))
      << r.err;
}

TEST_F(DataFaults, CrOnlyLineEndsAreRefusedNamingTheFileAndTheFix) {
  const std::string before = shard_files();
  const std::string file = dir_ / "raw/mono/xx.txt";
  const std::string text = fault_corpus_text(300, 3);
  std::string cr_only = text, crlf;
  std::replace(cr_only.begin(), cr_only.end(), '\n', '\r');
  for (const char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const std::string limit : {"1048576", "1024"}) {  // one line, or one too long
    SCOPED_TRACE(limit);
    write_file(file, cr_only);
    const auto r = binarize({"data.binarize.max_line_bytes=" + limit});
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(contains_all(r.err, {"'" + file + "' has a carriage return", "of its first line",
                                     "lines end in CR alone", "tr '\\r' '\\n' < FILE"}))
        << r.err;
    EXPECT_EQ(shard_files(), before);
  }
  // Held-out files are read by the same reader (data.heldout, xlme-pretrain).
  write_file(file, text);
  write_file(dir_ / "heldout/en-xx.en", "one two\rthree four\r");
  write_file(dir_ / "heldout/en-xx.xx", "one two\nthree four\n");
  const auto held = xlme::testing::run_tool("xlme-pretrain", heldout_run_args("run"));
  EXPECT_EQ(held.code, 1) << held.err;
  EXPECT_TRUE(contains_all(held.err, {"'" + (dir_ / "heldout/en-xx.en") + "' has a carriage"}))
      << held.err;

  // CRLF, and a byte-order mark before the first line: the same sentences as the plain text.
  const auto sentences = [&](const std::string& content) {
    write_file(file, content);
    const auto r = binarize({});
    EXPECT_EQ(r.code, 0) << r.err;
    return read_file(dir_ / "shards/mono/xx.bin");
  };
  const auto plain = sentences(text);
  EXPECT_EQ(sentences(crlf), plain);
  EXPECT_EQ(sentences("\xEF\xBB\xBF" + text), plain);
}

// Held-out files without text would make validation log zeros at every validation:
// xlme-pretrain refuses them at start, naming both files, before the first step.
TEST_F(DataFaults, EmptyHeldOutFilesAreRefusedAtStart) {
  write_file(dir_ / "heldout/en-xx.en", "");
  write_file(dir_ / "heldout/en-xx.xx", "");
  auto r = xlme::testing::run_tool("xlme-pretrain", heldout_run_args("run"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"held-out pair en-xx: " + (dir_ / "heldout/en-xx.en") + " and " +
                                       (dir_ / "heldout/en-xx.xx") + " hold no text",
                                   "validation would log zeros", "data.heldout.dir="}))
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(xlme::testing::step_folder(dir_ / "run", 1)))
      << "trained before refusing";
  // Blank lines only: the same.
  write_file(dir_ / "heldout/en-xx.en", "\n\n \n");
  write_file(dir_ / "heldout/en-xx.xx", "\n\n\n");
  r = xlme::testing::run_tool("xlme-pretrain", heldout_run_args("run2"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"held-out pair en-xx", "(3 lines, all blank)"})) << r.err;
}

// A run continued with another tokenizer of the same size would read every id as another piece:
// the resume is refused whatever --allow-data-change says, naming both tokenizers and their
// hashes.
TEST_F(DataFaults, ResumeWithAnotherTokenizerIsRefusedEvenWithAllowDataChange) {
  const auto pretrain = [&](const std::string& tokenizer, const std::string& shards, int steps,
                            const std::vector<std::string>& extra) {
    std::vector<std::string> args =
        xlme::testing::tiny_pretrain_args(dir_ / "run", steps,
                                          {"--set", "data.tokenizer=" + tokenizer, "--set",
                                           "model.vocab_size=0", "--set", "data.shards=" + shards});
    args.insert(args.end(), extra.begin(), extra.end());
    return xlme::testing::run_tool("xlme-pretrain", args);
  };
  auto r = pretrain(dir_ / "m.model", dir_ / "shards", 2, {});
  ASSERT_EQ(r.code, 0) << r.err;
  // Another SentencePiece model of the same size (trained on other text), and the corpus
  // binarized with it.
  const std::string train = "spm_train --input=" + (dir_ / "raw/para/en-xx.en") +
                            " --model_prefix=" + (dir_ / "other") +
                            " --vocab_size=60 --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3 "
                            ">/dev/null 2>&1";
  ASSERT_EQ(std::system(train.c_str()), 0);
  const auto b = run_data_tool({"binarize", "--input", dir_ / "raw", "--out", dir_ / "other-shards",
                                "--set", "data.tokenizer=" + (dir_ / "other.model")});
  ASSERT_EQ(b.code, 0) << b.err;
  r = pretrain(dir_ / "other.model", dir_ / "other-shards", 4, {"--allow-data-change"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(
      r.err,
      {"the checkpoint was trained with the tokenizer '" + (dir_ / "m.model") + "' (hash ",
       "but data.tokenizer '" + (dir_ / "other.model") + "' is another SentencePiece model (hash ",
       "--allow-data-change allows other shards, not another "
       "vocabulary"}))
      << r.err;
  // The same tokenizer with other shards is what --allow-data-change is for.
  std::filesystem::copy(dir_ / "raw", dir_ / "raw2", std::filesystem::copy_options::recursive);
  write_file(dir_ / "raw2/para/en-xx.en", fault_corpus_text(90, 5));
  write_file(dir_ / "raw2/para/en-xx.xx", fault_corpus_text(90, 7));
  const auto c = run_data_tool(
      {"binarize", "--input", dir_ / "raw2", "--out", dir_ / "new-shards", "--set", tokenizer()});
  ASSERT_EQ(c.code, 0) << c.err;
  r = pretrain(dir_ / "m.model", dir_ / "new-shards", 4, {"--allow-data-change"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"--allow-data-change: the para shards differ"})) << r.err;
}

// Flips bytes of the shards the training reader opens (xlme-data bench reads batches exactly as
// xlme-pretrain does) and damages the index's header and offsets (xlme-data inspect).
TEST_F(DataFaults, DamagedShardsAreNamedWithTheOffset) {
  const std::string bin_path = dir_ / "shards/mono/xx.bin", idx_path = dir_ / "shards/mono/xx.idx";
  const std::string bin = read_file(bin_path), idx = read_file(idx_path);
  auto bench = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"bench",
                                     "--shards",
                                     dir_ / "shards",
                                     "--seconds",
                                     "0.2",
                                     "--set",
                                     tokenizer(),
                                     "--set",
                                     "data.mono.max_len=64",
                                     "--set",
                                     "data.para.max_len=64"};
    for (const auto& s : sets) args.insert(args.end(), {"--set", s});
    return run_data_tool(args);
  };
  ASSERT_EQ(bench({}).code, 0);

  // A token id past the vocabulary: the byte offset of the token is named.
  std::string damaged = bin;
  damaged[20] = '\xff';
  damaged[21] = '\xff';
  write_file(bin_path, damaged);
  auto r = bench({});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(
      r.err, {"shard '" + (dir_ / "shards/mono/xx") + ".bin' is corrupt: token 10 (byte 20",
              "is 65535, outside the vocabulary of "}));

  // A flipped bit that leaves a valid id: found by the checksum on request.
  damaged = bin;
  damaged[20] ^= 1;
  write_file(bin_path, damaged);
  r = bench({"data.verify_shards=true"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"shard '" + bin_path + "' is corrupt: CRC32"}));
  write_file(bin_path, bin);

  data::ShardHeader header;
  std::memcpy(&header, idx.data(), sizeof(header));
  // Counts that wrap around 2^64 to the real index size.
  data::ShardHeader wrapped = header;
  wrapped.segments += uint64_t{1} << 61;
  wrapped.sequences = wrapped.segments;
  std::string crafted = idx;
  std::memcpy(crafted.data(), &wrapped, sizeof(wrapped));
  write_file(idx_path, crafted);
  r = run_data_tool({"inspect", "--shards", dir_ / "shards"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"shard index '" + idx_path + "' is truncated or corrupt",
                                   "which need more than 2^64 bytes"}));

  // Offsets that go backwards: the offset and its byte are named.
  crafted = idx;
  const uint64_t big = header.tokens;
  std::memcpy(crafted.data() + sizeof(header) + 8 * 3, &big, 8);
  write_file(idx_path, crafted);
  r = run_data_tool({"inspect", "--shards", dir_ / "shards"});
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(
      contains_all(r.err, {"shard index '" + idx_path + "' is corrupt: token offset 4 (byte " +
                           std::to_string(sizeof(header) + 8 * 4) + ")"}));
}

}  // namespace
}  // namespace xlme
