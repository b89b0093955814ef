// SentencePiece through the isolated plugin, in a process that uses LibTorch at the same time:
// ids must match Debian's spm_encode on the same model, and errors must name the file.
#include "xlme/data/sentencepiece.h"

#include "test_util.h"

#include <torch/torch.h>

#include <cstdlib>
#include <sstream>

namespace xlme::data {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// A small multilingual corpus in three scripts, deterministic.
std::string corpus() {
  const char* const words[] = {"the",  "house", "green", "river",   "Haus",  "grün",  "Fluss",
                               "über", "дом",   "река",  "зелёный", "и",     "water", "Wasser",
                               "вода", "small", "klein", "малый",   "light", "Licht"};
  std::ostringstream out;
  unsigned state = 12345;
  for (int line = 0; line < 400; ++line) {
    for (int w = 0; w < 8; ++w) {
      state = state * 1103515245u + 12345u;
      out << (w ? " " : "") << words[(state >> 16) % 20];
    }
    out << "\n";
  }
  return out.str();
}

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_.run([] {
      dir_ = new TempDir();
      write_file(*dir_ / "corpus.txt", corpus());
      const std::string command = "spm_train --input=" + (*dir_ / "corpus.txt") +
                                  " --model_prefix=" + (*dir_ / "m") +
                                  " --vocab_size=60 --model_type=unigram";
      xlme::testing::run_or_throw(command, *dir_ / "train.log");
    });
  }
  static void TearDownTestSuite() { delete dir_; }
  inline static xlme::testing::SuiteSetUp setup_;
  void SetUp() override { setup_.check(); }

  static TempDir* dir_;
};
TempDir* SentencePieceTest::dir_ = nullptr;

TEST_F(SentencePieceTest, MatchesSpmEncodeWhileLibTorchIsInUse) {
  const auto product = torch::mm(torch::ones({4, 4}), torch::ones({4, 4}));  // LibTorch is live
  ASSERT_EQ(product.sum().item<float>(), 64.0f);

  const SentencePiece sp(*dir_ / "m.model");
  EXPECT_EQ(sp.size(), 60);
  const std::string text = "the green house über Haus Fluss и зелёный river\nsmall Licht вода";
  write_file(*dir_ / "input.txt", text + "\n");
  const std::string command = "spm_encode --model=" + (*dir_ / "m.model") +
                              " --output_format=id <" + (*dir_ / "input.txt") + " >" +
                              (*dir_ / "ids.txt");
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::istringstream reference(read_file(*dir_ / "ids.txt"));
  std::istringstream lines(text);
  for (std::string line, expected;
       std::getline(lines, line) && std::getline(reference, expected);) {
    std::vector<int> want;
    std::istringstream ids(expected);
    for (int id; ids >> id;) want.push_back(id);
    EXPECT_EQ(sp.encode(line), want) << line;
    EXPECT_EQ(sp.decode(sp.encode(line)), line);
  }
  EXPECT_EQ(sp.id_to_piece(0), "<unk>");
  EXPECT_EQ(sp.piece_to_id("<unk>"), 0);
  EXPECT_EQ(sp.piece_to_id("no-such-piece-here"), 0);
}

TEST_F(SentencePieceTest, ErrorsNameTheModel) {
  EXPECT_TRUE(contains_all(error_message([&] { SentencePiece(*dir_ / "missing.model"); }),
                           {"SentencePiece model '" + (*dir_ / "missing.model") + "' not found"}));
  write_file(*dir_ / "garbage.model", "not a protobuf");
  EXPECT_TRUE(
      contains_all(error_message([&] { SentencePiece(*dir_ / "garbage.model"); }),
                   {"cannot load SentencePiece model '" + (*dir_ / "garbage.model") + "'"}));
  const SentencePiece sp(*dir_ / "m.model");
  EXPECT_TRUE(
      contains_all(error_message([&] { sp.id_to_piece(60); }), {"id 60 is not in [0, 60)"}));
}

}  // namespace
}  // namespace xlme::data
