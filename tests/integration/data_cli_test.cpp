// xlme-data's commands as a user runs them, on tiny data made here.
#include "test_util.h"

#include <cstdlib>
#include <filesystem>

namespace xlme {
namespace {

using xlme::testing::contains_all;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

using DataResult = xlme::testing::ToolRun;

DataResult run_data(const std::vector<std::string>& args) {
  return xlme::testing::run_tool("xlme-data", args);
}

TEST(DataCli, NeedsACommand) {
  const DataResult r = run_data({});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains_all(r.err, {"xlme-data needs a command: demo-corpus"}));
}

TEST(DataCli, DemoCorpusFromMsgfmtCatalogs) {
  TempDir dir;
  std::string po = "msgid \"\"\nmsgstr \"Content-Type: text/plain; charset=UTF-8\\n\"\n\n";
  for (int i = 0; i < 50; ++i) {
    po += "msgid \"the message number " + std::to_string(i) + "\"\nmsgstr \"сообщение номер " +
          std::to_string(i) + "\"\n\n";
  }
  write_file(dir / "locale/ru/LC_MESSAGES/x.po", po);
  const std::string msgfmt = "msgfmt -o " + (dir / "locale/ru/LC_MESSAGES/x.mo") + " " +
                             (dir / "locale/ru/LC_MESSAGES/x.po");
  ASSERT_EQ(std::system(msgfmt.c_str()), 0);
  const DataResult r = run_data(
      {"demo-corpus", "--out", dir / "out", "--locale-dir", dir / "locale", "--man-dir", ""});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"ru ", "1 languages"}));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/mono/ru.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out/para/en-ru.ru"));

  const DataResult missing =
      run_data({"demo-corpus", "--out", dir / "o2", "--locale-dir", dir / "none"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(contains_all(missing.err, {"locale folder '" + (dir / "none") + "' not found"}));
}

TEST(DataCli, TrainSpmWritesAModelInTheXlmrLayout) {
  TempDir dir;
  std::string text;
  unsigned state = 7;
  for (int i = 0; i < 400; ++i) {
    for (int w = 0; w < 6; ++w) {
      for (int c = 0; c < 5; ++c) {
        state = state * 1103515245u + 12345u;
        text += static_cast<char>('a' + (state >> 16) % 26);
      }
      text += ' ';
    }
    text += "\n";
  }
  write_file(dir / "corpus/mono/de.txt", text);
  write_file(dir / "corpus/mono/ru.txt", "маленький дом у реки\nи зелёная вода\n");
  const DataResult r =
      run_data({"train-spm", "--input", dir / "corpus", "--out", dir / "m.model", "--set",
                "data.spm.vocab_size=100", "--set", "data.spm.character_coverage=1.0"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"de ", "ru ", "100 ids in the XLM-R layout, <mask> = 99"}));
  EXPECT_TRUE(contains_all(read_file(dir / "m.vocab"), {"0\t<s>\n", "99\t<mask>\n"}));

  const DataResult bad = run_data({"train-spm", "--input", dir / "corpus", "--out", dir / "n.model",
                                   "--set", "data.mono.languages=[de,fr]"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains_all(bad.err, {"language 'fr' has no data"}));
}

TEST(DataCli, BinarizeThenInspect) {
  TempDir dir;
  std::string text;
  unsigned state = 3;
  for (int i = 0; i < 300; ++i) {
    for (int w = 0; w < 5; ++w) {
      for (int c = 0; c < 4; ++c) {
        state = state * 1103515245u + 12345u;
        text += static_cast<char>('a' + (state >> 16) % 12);
      }
      text += ' ';
    }
    text += i % 10 == 9 ? "\n\n" : "\n";
  }
  write_file(dir / "raw/mono/xx.txt", text);
  const std::string train = "spm_train --input=" + (dir / "raw/mono/xx.txt") +
                            " --model_prefix=" + (dir / "m") +
                            " --vocab_size=60 --bos_id=0 --pad_id=1 --eos_id=2 --unk_id=3 "
                            ">/dev/null 2>&1";
  ASSERT_EQ(std::system(train.c_str()), 0);
  const std::string tokenizer = "data.tokenizer=" + (dir / "m.model");
  DataResult r =
      run_data({"binarize", "--input", dir / "raw", "--out", dir / "shards", "--set", tokenizer});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"xx           mono 330 lines -> 300 sentences", "tokens/s"}));
  r = run_data({"inspect", "--shards", dir / "shards", "--set", tokenizer});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      contains_all(r.err, {"xx           mono        300 sentences", "30 docs", "checksums ok",
                           "decoded == SentencePiece", "1 shards verified"}));
  std::string bin = read_file(dir / "shards/mono/xx.bin");
  bin[10] ^= 0x40;
  write_file(dir / "shards/mono/xx.bin", bin);
  r = run_data({"inspect", "--shards", dir / "shards"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"xx.bin' is corrupt: CRC32"}));
  r = run_data({"binarize", "--input", dir / "raw"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"data.tokenizer is not set"}));
}

TEST(DataCli, BenchReportsBothTasksOnSyntheticShardsAndNamesAMissingFolder) {
  DataResult r = run_data({"bench", "--seconds", "0.2", "--synthetic-tokens", "200000", "--set",
                           "data.mono.max_len=128", "--set", "data.para.max_len=128", "--set",
                           "train.micro_batch_tokens=4096"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"writing synthetic shards", "MRTD: ", "TRTD: ",
                                   "M tokens/s assembled + masked", "% padding", "en-de", "p_j"}));
  TempDir dir;
  r = run_data({"bench", "--shards", dir / "none"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(
      contains_all(r.err, {"shard folder '" + (dir / "none") + "' (data.shards) not found"}));
}

}  // namespace
}  // namespace xlme
