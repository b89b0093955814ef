// xlme-pretrain end to end on real files: a generated corpus with a learnable translation
// relation -> xlme-data train-spm -> binarize -> pre-training on configs/pretrain/demo.yaml with
// fewer, smaller steps. All four losses fall, metrics and checkpoints appear, and a second
// invocation resumes at the end and has nothing left to do.
#include "test_util.h"

#include <array>
#include <regex>
#include <sstream>

namespace xlme {
namespace {

using testing::contains_all;
using testing::read_file;
using testing::run_tool;
using testing::TempDir;
using testing::write_file;

// "de" and "fr" words are English words with a fixed affix, so translations are learnable.
void write_corpus(const std::string& dir) {
  unsigned state = 17;
  auto next = [&state] { return (state = state * 1103515245u + 12345u) >> 16; };
  std::vector<std::string> words(80);
  for (auto& word : words) {
    for (unsigned n = 4 + next() % 4; n > 0; --n) word += static_cast<char>('a' + next() % 26);
  }
  // `lines` lines of `length` words: English, its "German" (suffix en) and "French" (prefix le).
  auto sentences = [&](int lines, int length) {
    std::array<std::string, 3> out;
    for (int line = 0; line < lines; ++line) {
      for (int w = 0; w < length; ++w) {
        const std::string& word = words[next() % words.size()];
        const char* sep = w ? " " : "";
        out[0] += sep + word;
        out[1] += sep + word + "en";
        out[2] += sep + ("le" + word);
      }
      for (auto& text : out) text += "\n";
    }
    return out;
  };
  const auto [en, de, fr] = sentences(600, 8);
  write_file(dir + "/mono/en.txt", en);
  write_file(dir + "/mono/de.txt", de);
  write_file(dir + "/mono/fr.txt", fr);
  write_file(dir + "/para/en-de.en", en);
  write_file(dir + "/para/en-de.de", de);
  write_file(dir + "/para/en-fr.en", en);
  write_file(dir + "/para/en-fr.fr", fr);
  // Held-out pairs: the same relation on new sentences (words drawn afresh).
  const auto [hen, hde, hfr] = sentences(60, 6);
  write_file(dir + "/heldout/en-de.en", hen);
  write_file(dir + "/heldout/en-de.de", hde);
  write_file(dir + "/heldout/en-fr.en", hen);
  write_file(dir + "/heldout/en-fr.fr", hfr);
}

// The value of `key` in a metrics line.
double metric(const std::string& line, const std::string& key) {
  std::smatch match;
  EXPECT_TRUE(std::regex_search(line, match, std::regex("\"" + key + "\": ([-0-9.e+]+)")))
      << key << " not in " << line;
  return match.size() > 1 ? std::stod(match[1].str()) : 0;
}

TEST(PretrainRun, DemoConfigLearnsOnARealPipeline) {
  TempDir dir;
  write_corpus(dir / "raw");
  auto r = run_tool("xlme-data", {"train-spm", "--input", dir / "raw", "--out", dir / "spm.model",
                                  "--set", "data.spm.vocab_size=200"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string tokenizer = "data.tokenizer=" + (dir / "spm.model");
  r = run_tool("xlme-data",
               {"binarize", "--input", dir / "raw", "--out", dir / "shards", "--set", tokenizer});
  ASSERT_EQ(r.code, 0) << r.err;

  const std::vector<std::string> args{"--config", "configs/pretrain/demo.yaml",
                                      "--set",    tokenizer,
                                      "--set",    "data.shards=" + (dir / "shards"),
                                      "--set",    "train.steps=40",
                                      "--set",    "train.warmup_steps=4",
                                      "--set",    "train.lr=2e-3",
                                      "--set",    "train.log_every=5",
                                      "--set",    "train.save_every=20",
                                      "--set",    "data.mono.max_len=64",
                                      "--set",    "data.para.max_len=64",
                                      "--set",    "train.micro_batch_tokens=1024",
                                      "--set",    "train.tokens_per_task=1024",
                                      "--set",    "data.heldout.dir=" + (dir / "raw/heldout"),
                                      "--set",    "data.heldout.pairs=[en-de, en-fr]",
                                      "--set",    "run.out_dir=" + (dir / "run")};
  r = run_tool("xlme-pretrain", args);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(
      r.err, {"start-up dry run", "validation step 0 | mlm", "retrieval@1 layer 1:", "(2 pairs;",
              "step 1/40 | lr", "step 40/40", "| mem ", "validation step 40 |", "done: 40 steps"}));
  EXPECT_TRUE(std::filesystem::exists(dir / "run/checkpoints/step_00000020/manifest.yaml"));
  EXPECT_TRUE(std::filesystem::exists(dir / "run/checkpoints/step_00000040/tokenizer.model"));

  std::vector<std::string> lines, validations;
  std::istringstream metrics(read_file(dir / "run/metrics.jsonl"));
  for (std::string line; std::getline(metrics, line);) {
    (line.find("\"kind\": \"validation\"") != std::string::npos ? validations : lines)
        .push_back(line);
  }
  ASSERT_EQ(lines.size(), 9u);        // steps 1, 5, 10, ..., 40
  ASSERT_EQ(validations.size(), 2u);  // before step 1 and at the last step
  EXPECT_TRUE(contains_all(validations.front(),
                           {"{\"step\": 0,", "\"f1/mrtd\": ", "\"retrieval/en-de/a_to_b\": ",
                            "\"retrieval/mean\": ", "\"probe_layer\": 1"}));
  EXPECT_TRUE(
      contains_all(validations.front(), {"\"unigram_accuracy/mlm\": ", "\"unigram_loss/mlm\": ",
                                         "\"unigram_accuracy/tlm\": ", "\"unigram_loss/tlm\": "}));
  EXPECT_TRUE(contains_all(lines.back(), {"\"peak_memory_mib\": ", "\"mfu\": null"}));
  // The interval's model FLOPs: step 1 alone, then 5 steps a line.
  EXPECT_GT(metric(lines.front(), "flops"), 0);
  EXPECT_GT(metric(lines.back(), "flops"), 3 * metric(lines.front(), "flops"));
  for (const char* loss : {"loss/mlm", "loss/tlm", "loss/mrtd", "loss/trtd"}) {
    EXPECT_LT(metric(validations.back(), loss), metric(validations.front(), loss)) << loss;
  }
  for (const char* loss : {"loss/mlm", "loss/tlm", "loss/mrtd", "loss/trtd"}) {
    EXPECT_LT(metric(lines.back(), loss), metric(lines.front(), loss)) << loss;
  }

  r = run_tool("xlme-pretrain", args);  // resumes at step 40: nothing left
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"resumed from", "at step 40", "done: 40 steps"}));
}

TEST(PretrainRun, MissingTokenizerIsAClearError) {
  TempDir dir;
  const auto r = run_tool("xlme-pretrain", {"--config", "configs/pretrain/demo.yaml", "--set",
                                            "data.tokenizer=" + (dir / "nope.model"), "--set",
                                            "run.out_dir=" + (dir / "run")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {dir / "nope.model", "not found"}));
}

}  // namespace
}  // namespace xlme
