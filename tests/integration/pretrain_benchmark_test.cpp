// xlme-pretrain --benchmark: one JSON line with the throughput and the time split, from the
// configs that reproduce the reference shapes.
#include "test_util.h"

#include <cmath>
#include <filesystem>
#include <string>

namespace xlme {
namespace {

TEST(PretrainBenchmark, PrintsOneJsonLineWithTheTimeSplit) {
  const testing::TempDir run;
  const auto r = testing::run_tool(
      "xlme-pretrain",
      {"--config", "configs/pretrain/benchmark/cpu_tiny.yaml", "--benchmark", "1", "--set",
       "model.vocab_size=500", "--set", "run.out_dir=" + (run / "run"), "--log-level", "warn"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.front(), '{');
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;  // exactly one line
  EXPECT_TRUE(testing::contains_all(
      r.out, {"\"benchmark\": \"xlme-pretrain\"", "\"steps\": 1", "\"tokens_per_s\": ",
              "\"data_ms\": ", "\"forward_ms\": ", "\"backward_ms\": ", "\"communication_ms\": ",
              "\"optimizer_ms\": ", "\"sequences_per_micro_batch\": 16", "\"sequence_length\": 64",
              "\"objectives\": \"xlme-mono\"", "\"peak_memory_mib\": ", "\"skipped_steps\": 0",
              "\"loss_first\": ", "\"loss_last\": "}));
  // The step's loss, finite and of the size of ln(vocabulary) terms (a few nats times lambda).
  const auto at = r.out.find("\"loss_last\": ");
  ASSERT_NE(at, std::string::npos);
  const double loss = std::stod(r.out.substr(at + 13));
  EXPECT_TRUE(std::isfinite(loss) && loss > 1.0) << r.out;
}

TEST(PretrainBenchmark, ProfileWritesTheTimePerOperator) {
  const testing::TempDir run;
  const std::string table = run / "ops.txt";
  const auto r = testing::run_tool(
      "xlme-pretrain",
      {"--config", "configs/pretrain/benchmark/cpu_tiny.yaml", "--benchmark", "1", "--profile",
       table, "--set", "model.vocab_size=500", "--set", "run.out_dir=" + (run / "run")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;  // still exactly one JSON line
  const std::string text = testing::read_file(table);
  // The header, the linear layers' products, their backward's products into the gradient buffers
  // (weight_grad), and xlme's own autograd functions.
  EXPECT_TRUE(testing::contains_all(text, {"operator", "calls/step", "self ms/step", "aten::addmm",
                                           "aten::addmm_", "torch::autograd::CppNode<"}))
      << text;
  EXPECT_TRUE(testing::contains_all(r.err, {"where the time goes (1 profiled steps"}));
}

// --benchmark-save: the time a step waits per checkpoint, saved synchronously and in the
// background, into a folder that is removed afterwards.
TEST(PretrainBenchmark, SaveTimesBothWaysAndLeavesNothing) {
  const testing::TempDir run;
  const std::string disk = run / "disk";
  std::filesystem::create_directories(disk);
  const auto r = testing::run_tool(
      "xlme-pretrain", {"--config", "configs/pretrain/benchmark/cpu_tiny.yaml", "--benchmark", "1",
                        "--benchmark-save", disk, "--set", "model.vocab_size=500", "--set",
                        "run.out_dir=" + (run / "run"), "--log-level", "warn"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;  // still exactly one JSON line
  EXPECT_TRUE(testing::contains_all(
      r.out, {"\"checkpoint_mb\": ", "\"save_blocked_ms_sync\": ", "\"save_blocked_ms_async\": ",
              "\"step_ms_during_async_save\": ", "\"save_wait_ms_after_one_step\": ",
              "\"peak_memory_mib_with_saves\": "}))
      << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(disk));
}

TEST(PretrainBenchmark, ProfileNeedsBenchmark) {
  const auto r = testing::run_tool("xlme-pretrain", {"--profile", "ops.txt"});
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(testing::contains_all(r.err, {"--profile requires --benchmark"})) << r.err;
}

TEST(PretrainBenchmark, NeedsAVocabularySize) {
  const testing::TempDir run;
  const auto r = testing::run_tool(
      "xlme-pretrain",
      {"--benchmark", "1", "--set", "model.vocab_size=0", "--set", "run.out_dir=" + (run / "run")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(testing::contains_all(r.err, {"--benchmark needs model.vocab_size"}));
}

}  // namespace
}  // namespace xlme
