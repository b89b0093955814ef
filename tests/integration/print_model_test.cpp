// xlme-pretrain --print-model: the parameter table from a config, and its error without a
// resolved vocabulary.
#include "export_fixtures.h"
#include "test_util.h"

#include <algorithm>
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

// Printing a table or an estimate is not a run: run.out_dir (by default runs/default in the
// current folder) is not created for a log file.
TEST(PrintModel, PrintingCreatesNoRunFolder) {
  const testing::TempDir dir;
  const std::string run = dir / "run";
  for (const std::string flag : {"--print-model", "--comm-estimate"}) {
    const auto r = testing::run_tool("xlme-pretrain",
                                     {flag, "--config", "configs/model/tiny.yaml", "--set",
                                      "model.vocab_size=8000", "--set", "run.out_dir=" + run});
    EXPECT_EQ(r.code, 0) << flag << "\n" << r.err;
    EXPECT_FALSE(std::filesystem::exists(run)) << flag << " created " << run;
  }
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

// The count on the table's `module` row ("discriminator  1,234,567  1.2M" -> 1234567).
int64_t module_count(const std::string& table, const std::string& module) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(module + " ", 0) != 0) continue;
    std::istringstream fields(line.substr(module.size()));
    std::string count;
    fields >> count;
    count.erase(std::remove(count.begin(), count.end(), ','), count.end());
    return std::stoll(count);
  }
  return -1;
}

// VECO: the cross-attention of every layer counts in the discriminator.
TEST(PrintModel, VecoCountsTheCrossAttention) {
  const auto veco = print_model(
      "--config configs/model/tiny.yaml --set model.vocab_size=8000 --set objectives.set=veco "
      "--set model.cross_attention=true");
  EXPECT_EQ(veco.code, 0) << veco.err;
  EXPECT_TRUE(testing::contains_all(veco.out, {"mlm_head", "discriminator"}));
  EXPECT_EQ(veco.out.find("generator"), std::string::npos) << veco.out;
  const auto mlm = print_model(
      "--config configs/model/tiny.yaml --set model.vocab_size=8000 --set objectives.set=mlm");
  // tiny.yaml: 2 layers 64 wide; q, k, v, output (64 x 64 + 64 each) and a LayerNorm (2 x 64).
  EXPECT_EQ(module_count(veco.out, "discriminator") - module_count(mlm.out, "discriminator"),
            2 * (4 * (64 * 64 + 64) + 2 * 64))
      << veco.out << mlm.out;
}

// --print-model counts from the config without building the weights it counts (for xl.yaml those
// take several GB), so that its peak memory is that of any start-up.
TEST(PrintModel, CountsFromTheConfigWithoutAllocatingTheWeights) {
  const testing::TempDir run;
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"--config", "configs/model/xl.yaml", "--set",
                                 "model.vocab_size=250002"},
        std::vector<std::string>{"--config", "configs/model/base.yaml", "--set",
                                 "model.vocab_size=250002", "--set", "model.layers=1024"},
        std::vector<std::string>{"--config", "configs/model/tiny.yaml", "--set",
                                 "model.vocab_size=2147483647"}}) {
    SCOPED_TRACE(sets[1] + " " + sets.back());
    std::vector<std::string> args{"--print-model", "--set", "run.out_dir=" + (run / "run")};
    args.insert(args.end(), sets.begin(), sets.end());
    const auto r = testing::run_tool_measured("xlme-pretrain", args);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(testing::contains_all(r.out, {"discriminator", "total"})) << r.out;
    EXPECT_LT(r.peak_rss_kib, 2 << 20) << "peak RSS " << r.peak_rss_kib << " KiB";
  }
}

// A model too large to allocate names its keys, not LibTorch's allocator alone.
TEST(PrintModel, AModelTooLargeToAllocateNamesItsKeys) {
  const testing::TempDir run;
  const auto r = testing::run_tool(
      "xlme-pretrain",
      {"--config", "configs/model/tiny.yaml", "--set", "model.vocab_size=2147483647", "--set",
       "run.out_dir=" + (run / "run"), "--set", "run.device=cpu", "--benchmark", "1"},
      "ulimit -v 4194304 &&");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(
      testing::contains_all(r.err, {"cannot allocate the model", "model.vocab_size 2147483647",
                                    "model.hidden_size 64", "lower those keys"}))
      << r.err;
}

TEST(PrintModel, NeedsAVocabularySize) {
  const auto r = print_model("--config configs/model/tiny.yaml");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(testing::contains_all(
      r.err, {"--print-model needs model.vocab_size", "--set model.vocab_size="}));
}

}  // namespace
}  // namespace xlme
