// Hostile fine-tuning inputs against the built xlme-finetune: a
// language code that names a path outside finetune.data_dir, and a PAWS-X line of 100 MB.
#include "xlme/finetune/finetune.h"

#include "export_fixtures.h"
#include "hostile_fixtures.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace xlme::finetune {
namespace {

namespace fs = std::filesystem;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::fails_cleanly;
using xlme::testing::run_hostile;
using xlme::testing::Sentinel;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// PAWS-X rows `s1 TAB s2 TAB label` of random words.
std::string hostile_pawsx_rows(int count, bool labels) {
  std::string out;
  unsigned state = 5;
  auto word = [&state] {
    std::string w;
    for (int n = 0; n < 5; ++n) w += static_cast<char>('a' + (state = state * 69069u + 1u) % 26);
    return w;
  };
  for (int i = 0; i < count; ++i) {
    out += word() + " " + word() + "\t" + word() + " " + word();
    if (labels) out += std::string("\t") + (i % 2 ? "1" : "0");
    out += "\n";
  }
  return out;
}

// One tiny checkpoint for the suite; each test has its own data and run folders under `root_`.
class HostileFinetune : public xlme::testing::TinyCheckpointSuite<HostileFinetune> {
 protected:
  void SetUp() override {
    TinyCheckpointSuite::SetUp();
    write_file(data_dir() + "/pawsx/train-en.tsv", hostile_pawsx_rows(16, true));
    write_file(data_dir() + "/pawsx/dev-en.tsv", hostile_pawsx_rows(8, true));
    write_file(data_dir() + "/pawsx/test-en.tsv", hostile_pawsx_rows(8, false));
  }

  // root/a/download: "../../x" from its pawsx/ folder is root/a/x.
  std::string data_dir() const { return root_ / "a/download"; }
  std::string out_dir() const { return root_ / "a/out"; }

  // xlme-finetune's arguments for pawsx on data_dir(), then `extra` --set values.
  std::vector<std::string> args(const std::vector<std::string>& extra) const {
    std::vector<std::string> sets = {"finetune.task=pawsx",
                                     "finetune.init=" + checkpoint(),
                                     "finetune.data_dir=" + data_dir(),
                                     "run.out_dir=" + out_dir(),
                                     "run.device=cpu",
                                     "run.threads=1",
                                     "finetune.max_len=64",
                                     "finetune.epochs=1",
                                     "finetune.batch_size=8",
                                     "finetune.select=last"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    std::vector<std::string> out;
    for (const auto& s : sets) out.insert(out.end(), {"--set", s});
    return out;
  }

  TempDir root_;
};

// Item 3(b): `finetune.languages: [en, ../../x]` read root/a/x-test.tsv (XTREME's original
// `{lang}-{split}.tsv` naming) and would write predictions beside it.
TEST_F(HostileFinetune, LanguageCodeThatIsAPathIsRejectedAtConfigTime) {
  const Sentinel outside(root_ / "a/x-test.tsv", hostile_pawsx_rows(8, false));
  const auto run = run_hostile("xlme-finetune", args({"finetune.languages=[en, ../../x]"}));
  EXPECT_TRUE(fails_cleanly(run, 1, {"finetune.languages", "'../../x'", "letters, digits"}));
  EXPECT_TRUE(outside.untouched());
  EXPECT_FALSE(fs::exists(root_ / "a/x.tsv"));
  EXPECT_FALSE(fs::exists(out_dir() + "/results.json"));
  for (const auto* key : {"finetune.train_language=../en", "finetune.pairs=[en-de, ../de]"}) {
    EXPECT_TRUE(fails_cleanly(run_hostile("xlme-finetune", args({key})), 1, {"'../"})) << key;
  }
}

// The same codes past the config check (a Config built in code): every path fine-tuning builds
// goes through path_under, so the test set outside data_dir is refused before training, unread.
TEST_F(HostileFinetune, PathsBuiltFromCodesStayUnderTheirRoots) {
  const Sentinel outside(root_ / "a/x-test.tsv", hostile_pawsx_rows(8, false));
  auto c = config::load_config("", [&] {
    std::vector<std::string> sets;
    const auto a = args({});
    for (size_t i = 1; i < a.size(); i += 2) sets.push_back(a[i]);
    return sets;
  }());
  c.finetune.languages = {"en", "../../x"};
  EXPECT_TRUE(contains_all(error_message([&] { run_finetune(c); }),
                           {"finetune.languages names ../../x", "leads outside",
                            "'pawsx/../../x-test.tsv'", "'" + data_dir() + "'"}));
  EXPECT_TRUE(outside.untouched());
}

// Item 8: one 100 MB field took 24 GB before tokenization; it is cut to max_len * 64 bytes.
TEST_F(HostileFinetune, HundredMegabyteFieldIsCutBeforeTokenization) {
  {
    std::ofstream train(data_dir() + "/pawsx/train-en.tsv", std::ios::app | std::ios::binary);
    train << std::string(100 << 20, 'a') << " end\tshort\t1\n";
  }
  // This run peaks at 1.2 GiB of address space (0.5 GiB resident) with the 100 MB line read;
  // tokenizing the whole line needed 24 GB, and fails here with bad_alloc.
  const auto run =
      run_hostile("xlme-finetune", args({"finetune.languages=[en]"}), "", 3LL * 1024 * 1024);
  EXPECT_TRUE(fails_cleanly(run, 0,
                            {data_dir() + "/pawsx/train-en.tsv: 1 text field(s) longer "
                                          "than 4096 bytes (64 bytes per token of "
                                          "max_len 64)",
                             "train-en.tsv:17"}));
  EXPECT_TRUE(fs::exists(out_dir() + "/results.json"));
}

// One 30 MB line in LASER's Tatoeba files or a retrieval pair's file would take tens of bytes of
// memory per byte to tokenize; it is cut to retrieval_max_len * 64 bytes first, with a warning, so
// that the peak RSS grows by less than 4 bytes per byte of the line.
TEST_F(HostileFinetune, HugeTatoebaAndRetrievalLinesAreCutBeforeTokenization) {
  const std::string words = "alpha beta gamma\ndelta epsilon zeta\neta theta iota\n";
  const std::string huge(30 << 20, 'a');
  struct Case {
    std::string task, xx, en;  // the files of a language pair
    std::string dir_key;       // the key naming their folder
  };
  const std::string gold = root_ / "gold", pairs = root_ / "pairs";
  for (const Case& c : {Case{"tatoeba", gold + "/tatoeba.deu-eng.deu",
                             gold + "/tatoeba.deu-eng.eng", "finetune.gold_dir=" + gold},
                        Case{"retrieval", pairs + "/de-en.de", pairs + "/de-en.en",
                             "finetune.data_dir=" + pairs}}) {
    SCOPED_TRACE(c.task);
    const auto peak = [&](const std::string& first_line) {
      write_file(c.xx, first_line + "\n" + words);
      write_file(c.en, "zero\n" + words);
      std::vector<std::string> args;
      for (const auto& s :
           {"finetune.task=" + c.task, "finetune.init=" + checkpoint(), c.dir_key,
            std::string("finetune.languages=[de]"), std::string("finetune.min_sentences=1"),
            std::string("finetune.layer=2"), "run.out_dir=" + out_dir(),
            std::string("run.device=cpu"), std::string("run.threads=1")}) {
        args.insert(args.end(), {"--set", s});
      }
      return xlme::testing::run_tool_measured("xlme-finetune", args);
    };
    const auto plain = peak("one two");
    ASSERT_EQ(plain.code, 0) << plain.err;
    const auto cut = peak(huge);
    ASSERT_EQ(cut.code, 0) << cut.err;
    EXPECT_TRUE(contains_all(cut.err, {"1 sentence(s) longer than", "bytes per token of max_len",
                                       "the first at line 1 of its file"}))
        << cut.err;
    EXPECT_LT(cut.peak_rss_kib - plain.peak_rss_kib, 4 * (30 << 10))
        << "peak RSS " << plain.peak_rss_kib << " KiB without the line, " << cut.peak_rss_kib
        << " KiB with it";
  }
}

// An empty train, dev or test file is an error naming the file, before any training (not "no
// training features for en" or "the en dev set of pawsx has no labels" without its name, nor a
// 0-line submission with exit 0).
TEST_F(HostileFinetune, EmptyTrainDevAndTestFilesAreNamed) {
  for (const std::string split : {"train", "dev", "test"}) {
    SCOPED_TRACE(split);
    const std::string file = data_dir() + "/pawsx/" + split + "-en.tsv";
    const std::string kept = xlme::testing::read_file(file);
    write_file(file, "");
    auto run = run_hostile("xlme-finetune", args({"finetune.languages=[en]"}));
    EXPECT_TRUE(fails_cleanly(run, 1, {"'" + file + "' is empty (0 bytes)"}));
    EXPECT_FALSE(fs::exists(out_dir() + "/predictions/pawsx/test-en.tsv"));
    write_file(file, "\n\n\n");  // blank lines only
    run = run_hostile("xlme-finetune", args({"finetune.languages=[en]"}));
    EXPECT_TRUE(fails_cleanly(run, 1, {"'" + file + "' holds no sentence pair"}));
    write_file(file, kept);
  }
}

// A NUL byte inside a TSV field (the text would be cut there downstream) is an error naming the
// file and line.
TEST_F(HostileFinetune, NulInsideATsvFieldIsNamed) {
  const std::string file = data_dir() + "/pawsx/train-en.tsv";
  write_file(file, hostile_pawsx_rows(2, true) + std::string("ab\0cd ef\tgh ij\t1\n", 17) +
                       hostile_pawsx_rows(4, true));
  const auto run = run_hostile("xlme-finetune", args({"finetune.languages=[en]"}));
  EXPECT_TRUE(fails_cleanly(run, 1, {file + ":3: a NUL byte at byte 3 of the line"}));
}

// A byte-order mark must not be invisible in the label error ("label '1' is not in the pawsx
// label set [0 1]"). At the start of a file it is dropped, as every text reader drops it;
// elsewhere (a file with one pasted in) the error shows its bytes and names it.
TEST_F(HostileFinetune, ByteOrderMarkIsDroppedAtTheStartAndShownInALabel) {
  const std::string file = data_dir() + "/pawsx/train-en.tsv";
  const std::string rows = hostile_pawsx_rows(16, true);
  write_file(file, "\xEF\xBB\xBF" + rows);
  auto run = run_hostile("xlme-finetune", args({"finetune.languages=[en]"}));
  EXPECT_TRUE(fails_cleanly(run, 0, {}));
  write_file(file, rows +
                       "ab cd\tef gh\t\xEF\xBB\xBF"
                       "1\n");
  run = run_hostile("xlme-finetune", args({"finetune.languages=[en]"}));
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {file + ":17: label '\\xEF\\xBB\\xBF"
                                    "1' is not in the pawsx label set",
                             "it holds a UTF-8 byte-order mark"}));
}

}  // namespace
}  // namespace xlme::finetune
