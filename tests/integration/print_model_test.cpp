// xlme-pretrain --print-model: the parameter table from a config, and its error without a
// resolved vocabulary.
#include "test_util.h"

#include <sstream>
#include <string>

namespace xlme {
namespace {

// xlme-pretrain --print-model ARGS (split at spaces).
testing::ToolRun print_model(const std::string& args) {
  const testing::TempDir run;  // keeps the run's log folder out of the source tree
  std::vector<std::string> argv{"--print-model", "--set", "run.out_dir=" + (run / "run")};
  std::istringstream words(args);
  for (std::string w; words >> w;) argv.push_back(w);
  return testing::run_tool("xlme-pretrain", argv);
}

TEST(PrintModel, PrintsParametersPerModule) {
  const auto r = print_model("--config configs/model/tiny.yaml --set model.vocab_size=8000");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(testing::contains_all(
      r.out, {"embeddings", "generator", "discriminator", "generator_head", "discriminator_head",
              "total", "discriminator + embeddings (kept)"}));
  const auto mlm = print_model(
      "--config configs/model/tiny.yaml --set model.vocab_size=8000 --set objectives.set=mlm");
  EXPECT_EQ(mlm.code, 0) << mlm.err;
  EXPECT_TRUE(testing::contains_all(mlm.out, {"mlm_head"}));
  EXPECT_EQ(mlm.out.find("generator"), std::string::npos) << mlm.out;
}

TEST(PrintModel, NeedsAVocabularySize) {
  const auto r = print_model("--config configs/model/tiny.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(testing::contains_all(
      r.err, {"--print-model needs model.vocab_size", "--set model.vocab_size="}));
}

}  // namespace
}  // namespace xlme
