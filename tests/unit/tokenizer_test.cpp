// SentencePiece training through the plugin with language-balanced sampling, and the XLM-R id
// layout in both directions for xlme's own models and for XLM-R-style models (made here by
// spm_train with its default special ids), compared with Debian's spm_encode.
#include "xlme/data/tokenizer.h"
#include "xlme/data/spm_trainer.h"

#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>

namespace xlme::data {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// `lines` pseudo-random sentences from a language's word list, deterministic.
std::string sentences(const std::vector<std::string>& words, int lines, unsigned seed) {
  std::ostringstream out;
  unsigned state = seed;
  for (int line = 0; line < lines; ++line) {
    if (line > 0 && line % 25 == 0) out << "\n";  // a document boundary
    for (int w = 0; w < 7; ++w) {
      state = state * 1103515245u + 12345u;
      out << (w ? " " : "") << words[(state >> 16) % words.size()];
    }
    out << "\n";
  }
  return out.str();
}

const std::vector<std::string> kGerman = {"das",    "Haus",  "grün",  "Fluss", "über",
                                          "Wasser", "klein", "Licht", "und",   "Straße"};
const std::vector<std::string> kRussian = {"дом",   "река", "зелёный", "и",   "вода",
                                           "малый", "свет", "улица",   "над", "город"};
const std::vector<std::string> kGreek = {"σπίτι", "ποτάμι", "πράσινο", "και",
                                         "νερό",  "μικρό",  "φως",     "δρόμος"};

// spm_encode's ids for each line of `text`.
std::vector<std::vector<int>> spm_encode(const std::string& model, const std::string& text,
                                         const TempDir& dir) {
  write_file(dir / "encode-in.txt", text);
  const std::string command = "spm_encode --model=" + model + " --output_format=id <" +
                              (dir / "encode-in.txt") + " >" + (dir / "encode-out.txt");
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::vector<std::vector<int>> all;
  std::istringstream lines(read_file(dir / "encode-out.txt"));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ids(line);
    all.emplace_back();
    for (int id; ids >> id;) all.back().push_back(id);
  }
  return all;
}

const std::string kProbe =
    "das grüne Haus über den Fluss\nдом и река над городом\nμικρό σπίτι και νερό\nunseen 漢字";

TEST(Tokenizer, BalancedSampleCountsFollowTheFormula) {
  const std::vector<int64_t> lines = {1000000, 10000, 100, 1};
  for (const double beta : {0.3, 0.7, 1.0}) {
    const auto counts = balanced_sample_counts(lines, beta, 50000);
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 50000);
    double sum = 0;
    for (const int64_t m : lines) sum += std::pow(static_cast<double>(m), beta);
    for (size_t j = 0; j < lines.size(); ++j) {
      const double expected = 50000.0 * std::pow(static_cast<double>(lines[j]), beta) / sum;
      EXPECT_LT(std::abs(static_cast<double>(counts[j]) - expected), 1.0) << beta << " " << j;
    }
  }
}

class TokenizerTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      write_file(*dir_ / "corpus/mono/de.txt", sentences(kGerman, 400, 1));
      write_file(*dir_ / "corpus/mono/ru.txt", sentences(kRussian, 100, 2));
      write_file(*dir_ / "corpus/mono/el.txt", sentences(kGreek, 10, 3));
      SpmTrainingOptions options;
      options.corpus_dir = *dir_ / "corpus";
      options.out_model = *dir_ / "own.model";
      options.spm.vocab_size = 80;
      options.spm.character_coverage = 1.0;
      options.spm.max_sentences = 1000;
      options.threads = 2;
      report_ = new SpmTrainingReport(train_sentencepiece(options));
    });
  }
  static void TearDownTestSuite() {
    delete report_;
    delete dir_;
  }
  inline static xlme::testing::SuiteSetUp setup_;
  void SetUp() override { setup_.check(); }
  static TempDir* dir_;
  static SpmTrainingReport* report_;
};
TempDir* TokenizerTraining::dir_ = nullptr;
SpmTrainingReport* TokenizerTraining::report_ = nullptr;

TEST_F(TokenizerTraining, SamplesLanguagesWithTheExponent) {
  ASSERT_EQ(report_->languages.size(), 3u);
  EXPECT_EQ(report_->languages[0].language, "de");
  EXPECT_EQ(report_->languages[1].language, "el");
  EXPECT_EQ(report_->languages[2].language, "ru");
  const std::vector<int64_t> lines = {400, 10, 100};              // blank lines are not sentences
  const auto expected = balanced_sample_counts(lines, 0.3, 510);  // all 510 lines < 1000
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(report_->languages[j].lines, lines[j]);
    EXPECT_EQ(report_->languages[j].sampled, expected[j]);
  }
  EXPECT_GT(report_->languages[1].sampled, 10);  // the small language is upsampled
  EXPECT_LT(report_->languages[0].sampled, 400);
}

TEST_F(TokenizerTraining, OwnLayoutMatchesSpmEncode) {
  const Tokenizer tok(*dir_ / "own.model", VocabLayout::kOwn);
  EXPECT_EQ(tok.vocab_size(), 80);
  EXPECT_EQ(report_->vocab_size, 80);
  EXPECT_EQ(tok.special_ids().mask, 79);
  EXPECT_EQ(tok.sentencepiece().id_to_piece(0), "<s>");
  EXPECT_EQ(tok.sentencepiece().id_to_piece(1), "<pad>");
  EXPECT_EQ(tok.sentencepiece().id_to_piece(2), "</s>");
  EXPECT_EQ(tok.sentencepiece().id_to_piece(3), "<unk>");
  const auto reference = spm_encode(*dir_ / "own.model", kProbe + "\n", *dir_);
  std::istringstream lines(kProbe);
  size_t k = 0;
  for (std::string line; std::getline(lines, line); ++k) {
    const auto ids = tok.encode(line);
    ASSERT_LT(k, reference.size());
    EXPECT_EQ(std::vector<int>(ids.begin(), ids.end()), reference[k]) << line;  // shift 0
    if (line.find("unseen") == std::string::npos) {
      EXPECT_EQ(tok.decode(ids), line);
    }
  }
  // <s>, </s>, <pad> and <mask> are skipped by decode.
  auto ids = tok.encode("das Haus");
  ids.insert(ids.begin(), 0);
  ids.push_back(79);
  ids.push_back(2);
  ids.push_back(1);
  EXPECT_EQ(tok.decode(ids), "das Haus");
  const std::string vocab = read_file(*dir_ / "own.vocab");
  EXPECT_TRUE(contains_all(vocab, {"0\t<s>\n1\t<pad>\n2\t</s>\n3\t<unk>\n", "\n79\t<mask>\n"}));
}

TEST_F(TokenizerTraining, XlmrLayoutShiftsSpmIdsLikeFairseq) {
  // XLM-R's sentencepiece.bpe.model has spm_train's default ids: <unk>=0, <s>=1, </s>=2.
  const std::string prefix = *dir_ / "xlmr";
  const std::string command = "spm_train --input=" + (*dir_ / "corpus/mono/de.txt") +
                              " --model_prefix=" + prefix + " --vocab_size=60 --model_type=bpe >" +
                              (*dir_ / "spm_train.log") + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_file(*dir_ / "spm_train.log");
  const Tokenizer tok(prefix + ".model", VocabLayout::kXlmr);
  EXPECT_EQ(tok.vocab_size(), 62);  // 60 pieces + <pad> + <mask>, as 250000 -> 250002
  EXPECT_EQ(tok.special_ids().mask, 61);
  EXPECT_EQ(tok.from_spm(0), 3);  // <unk>
  EXPECT_EQ(tok.from_spm(1), 0);  // <s>
  EXPECT_EQ(tok.from_spm(2), 2);  // </s>
  EXPECT_EQ(tok.from_spm(3), 4);
  EXPECT_EQ(tok.from_spm(59), 60);
  EXPECT_EQ(tok.to_spm(1), -1);   // <pad> has no SentencePiece id
  EXPECT_EQ(tok.to_spm(61), -1);  // nor has <mask>
  for (int spm_id = 0; spm_id < 60; ++spm_id) EXPECT_EQ(tok.to_spm(tok.from_spm(spm_id)), spm_id);

  const std::string text = "das grüne Haus über den Fluss\nLicht und Wasser ñ";
  const auto reference = spm_encode(prefix + ".model", text + "\n", *dir_);
  std::istringstream lines(text);
  size_t k = 0;
  for (std::string line; std::getline(lines, line); ++k) {
    std::vector<int32_t> shifted;
    for (const int id : reference.at(k)) shifted.push_back(id >= 3 ? id + 1 : (id == 0 ? 3 : id));
    EXPECT_EQ(tok.encode(line), shifted) << line;
  }
  EXPECT_EQ(tok.decode(tok.encode("das Haus über den Fluss")), "das Haus über den Fluss");
  EXPECT_NE(tok.hash(), Tokenizer(*dir_ / "own.model", VocabLayout::kOwn).hash());

  EXPECT_TRUE(contains_all(error_message([&] { Tokenizer(prefix + ".model", VocabLayout::kOwn); }),
                           {"tokenizer '" + prefix + ".model' does not have xlme's own id layout",
                            "0 = '<unk>', 1 = '<s>', 2 = '</s>'", "set data.vocab_layout=xlmr"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { Tokenizer(*dir_ / "own.model", VocabLayout::kXlmr); }),
                   {"does not have XLM-R's SentencePiece layout", "set data.vocab_layout=own"}));
  EXPECT_TRUE(contains_all(error_message([] { parse_vocab_layout("fairseq"); }),
                           {"unknown vocabulary layout 'fairseq'; expected own or xlmr"}));
}

TEST(TokenizerTrainingErrors, MissingFoldersAndLanguagesWithoutData) {
  TempDir dir;
  SpmTrainingOptions options;
  options.corpus_dir = dir / "corpus";
  options.out_model = dir / "m.model";
  EXPECT_TRUE(contains_all(error_message([&] { train_sentencepiece(options); }),
                           {"corpus folder '" + (dir / "corpus") + "' has no mono/ folder"}));
  std::filesystem::create_directories(dir / "corpus/mono");
  EXPECT_TRUE(contains_all(error_message([&] { train_sentencepiece(options); }),
                           {"has no <lang>.txt, .txt.gz or .txt.xz files"}));
  write_file(dir / "corpus/mono/de.txt", "\n\n");
  EXPECT_TRUE(contains_all(error_message([&] { train_sentencepiece(options); }),
                           {"language 'de' has no data: '" + (dir / "corpus/mono/de.txt") +
                            "' has no "
                            "non-empty lines"}));
  options.languages = {"de", "fr"};
  EXPECT_TRUE(contains_all(error_message([&] { train_sentencepiece(options); }),
                           {"language 'fr' has no data: no " + (dir / "corpus/mono") + "/fr.txt",
                            "data.mono.languages"}));
  write_file(dir / "corpus/mono/de.txt", "ein Satz hier\n");
  options.languages = {};
  options.spm.vocab_size = 5000;
  EXPECT_TRUE(contains_all(error_message([&] { train_sentencepiece(options); }),
                           {"SentencePiece training failed:", "Vocabulary size"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "m.model"));
}

}  // namespace
}  // namespace xlme::data
