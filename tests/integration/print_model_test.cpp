// xlme-pretrain --print-model: the parameter table from a config, and its error without a
// resolved vocabulary.
#include "export_fixtures.h"
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

// A distillation student: its own parameters in the table, the frozen teacher's beside it.
TEST(PrintModel, DistillationCountsTheStudentAndStatesTheTeacher) {
  const testing::TempDir dir;
  // The teacher: 1 layer, 32 wide, 64 ids (testing::tiny_train_config).
  testing::make_tiny_checkpoint(testing::tiny_train_config(2, 1, 0.0), dir / "teacher");
  const auto r = print_model(
      "--config configs/model/tiny.yaml --set model.vocab_size=64 --set objectives.set=distill "
      "--set distill.relation_heads=4 --set distill.teacher=" +
      (dir / "teacher"));
  EXPECT_EQ(r.code, 0) << r.err;
  // tiny.yaml's student: embeddings (64 + 512) x 64 = 36,864 and the 2-layer encoder.
  EXPECT_TRUE(testing::contains_all(
      r.out, {"embeddings", "36,864", "discriminator",
              "teacher (frozen, not trained or saved):", "1 layers; relations of layer 1"}));
  EXPECT_EQ(r.out.find("generator"), std::string::npos) << r.out;
  const auto missing = print_model(
      "--config configs/model/tiny.yaml --set model.vocab_size=64 --set "
      "objectives.set=distill --set distill.teacher=" +
      (dir / "nowhere"));
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(testing::contains_all(missing.err,
                                    {"distill.teacher '" + (dir / "nowhere") + "'", "not found"}));
}

TEST(PrintModel, NeedsAVocabularySize) {
  const auto r = print_model("--config configs/model/tiny.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(testing::contains_all(
      r.err, {"--print-model needs model.vocab_size", "--set model.vocab_size="}));
}

}  // namespace
}  // namespace xlme
