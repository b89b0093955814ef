// xlme-pretrain --print-model: the parameter table from a config, and its error without a
// resolved vocabulary.
#include "test_util.h"

#include <sys/wait.h>

#include <cstdlib>
#include <string>

namespace xlme {
namespace {

struct PrintModelRun {
  int code = -1;
  std::string out, err;
};

PrintModelRun print_model(const std::string& args) {
  testing::TempDir scratch;
  const std::string command = "cd '" + std::string(XLME_SOURCE_DIR) + "' && '" +
                              std::string(XLME_BINARY_DIR) + "/xlme-pretrain' --print-model " +
                              args + " --set run.out_dir='" + (scratch / "run") + "' >'" +
                              (scratch / "out") + "' 2>'" + (scratch / "err") + "'";
  const int status = std::system(command.c_str());
  PrintModelRun r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = testing::read_file(scratch / "out");
  r.err = testing::read_file(scratch / "err");
  return r;
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
