// The run loop: a run stopped by SIGTERM and resumed ends exactly where an uninterrupted run ends,
// also when its newest checkpoint is damaged; metrics lines are written.
#include "xlme/train/pretrain.h"

#include "xlme/common/exit_codes.h"
#include "xlme/data/synthetic.h"
#include "xlme/train/signals.h"
#include "xlme/train/trainer.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/serialize.h>

#include <csignal>
#include <filesystem>
#include <sstream>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;
using xlme::testing::contains_all;
using xlme::testing::read_file;
using xlme::testing::TempDir;

config::Config run_config(const std::string& out_dir, int64_t save_every) {
  auto c = xlme::testing::tiny_train_config(4, 1, /*dropout=*/0.1);
  c.train.steps = 6;
  c.train.log_every = 1;
  c.train.save_every = save_every;
  c.train.keep_last = 5;
  c.run.out_dir = out_dir;
  return c;
}

// Synthetic batches that raise SIGTERM while the `stop_at`-th micro-batch is read.
class SignallingBatches : public data::SyntheticBatches {
 public:
  SignallingBatches(const config::Config& c, int stop_at)
      : data::SyntheticBatches(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15, 3),
        stop_at_(stop_at) {}
  data::Batch next(data::Task task) override {
    if (++calls_ == stop_at_) std::raise(SIGTERM);
    return data::SyntheticBatches::next(task);
  }

 private:
  int stop_at_;
  int calls_ = 0;
};

model::ElectraModel final_model(const config::Config& c) {
  auto model = xlme::testing::make_tiny_model(c, 0);
  torch::load(model, (fs::path(c.run.out_dir) / "checkpoints/step_00000006/model.pt").string());
  return model;
}

TEST(Pretrain, StoppedAndResumedRunEndsLikeTheUninterruptedOne) {
  TempDir dir;
  const auto straight = run_config(dir / "straight", 0);
  SignallingBatches never(straight, -1);
  ASSERT_EQ(pretrain(straight, PretrainOptions{}, never, xlme::testing::single_process()), kExitOk);
  EXPECT_TRUE(contains_all(
      read_file(dir / "straight/metrics.jsonl"),
      {"{\"step\": 1, \"kind\": \"train\"", "\"loss/mlm\": ", "\"f1/mrtd\": ", "{\"step\": 6, "}));

  const auto stopped = run_config(dir / "stopped", 2);
  // 2 micro-batches (mono + para) per step: the 5th read is in step 3, which is given up after
  // its first micro-batch; step 2's periodic checkpoint is the one to resume from.
  SignallingBatches signalled(stopped, 5);
  ASSERT_EQ(pretrain(stopped, PretrainOptions{}, signalled, xlme::testing::single_process()),
            kExitPreempted);
  EXPECT_TRUE(fs::exists(dir / "stopped/checkpoints/step_00000002"));
  EXPECT_FALSE(fs::exists(dir / "stopped/checkpoints/step_00000003"));

  torch::manual_seed(12345);  // a new process: other random state
  SignallingBatches resumed(stopped, -1);
  ASSERT_EQ(pretrain(stopped, PretrainOptions{}, resumed, xlme::testing::single_process()),
            kExitOk);
  auto a = final_model(straight);
  auto b = final_model(stopped);
  xlme::testing::expect_same_parameters(a, b, /*atol=*/0);
}

// train.async_save: checkpoints written in the background hold the same model bytes as those
// written while training waits; a run stopped while one is in flight waits for it, and resumed
// from it ends bit for bit like the uninterrupted run.
TEST(Pretrain, BackgroundSavesResumeLikeTheUninterruptedRun) {
  TempDir dir;
  auto straight = run_config(dir / "straight", 1);
  straight.train.async_save = false;
  straight.train.keep_last = 10;
  SignallingBatches never(straight, -1);
  ASSERT_EQ(pretrain(straight, PretrainOptions{}, never, xlme::testing::single_process()), kExitOk);

  auto stopped = run_config(dir / "stopped", 1);
  stopped.train.async_save = true;
  stopped.train.keep_last = 10;
  // The 7th read is in step 4, given up after its first micro-batch while step 3's checkpoint is
  // written in the background.
  SignallingBatches signalled(stopped, 7);
  ASSERT_EQ(pretrain(stopped, PretrainOptions{}, signalled, xlme::testing::single_process()),
            kExitPreempted);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::string name = fmt::format("checkpoints/step_{:08d}", step);
    EXPECT_NO_THROW(checkpoint::CheckpointManager::verify(dir / ("stopped/" + name))) << name;
    const std::string written = read_file(dir / ("stopped/" + name + "/model.pt"));
    EXPECT_FALSE(written.empty()) << name;
    EXPECT_TRUE(written == read_file(dir / ("straight/" + name + "/model.pt"))) << name;
  }
  EXPECT_FALSE(fs::exists(dir / "stopped/checkpoints/step_00000004"));
  EXPECT_FALSE(fs::exists(dir / "stopped/checkpoints/step_00000004.tmp"));

  torch::manual_seed(12345);  // a new process: other random state
  SignallingBatches resumed(stopped, -1);
  ASSERT_EQ(pretrain(stopped, PretrainOptions{}, resumed, xlme::testing::single_process()),
            kExitOk);
  auto a = final_model(straight);
  auto b = final_model(stopped);
  xlme::testing::expect_same_parameters(a, b, /*atol=*/0);
}

TEST(Pretrain, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  TempDir dir;
  const auto straight = run_config(dir / "straight", 0);
  SignallingBatches never(straight, -1);
  ASSERT_EQ(pretrain(straight, PretrainOptions{}, never, xlme::testing::single_process()), kExitOk);

  const auto stopped = run_config(dir / "stopped", 2);
  SignallingBatches signalled(stopped, 7);  // gives up step 4: saves step 3 (2 is periodic)
  ASSERT_EQ(pretrain(stopped, PretrainOptions{}, signalled, xlme::testing::single_process()),
            kExitPreempted);
  fs::resize_file(dir / "stopped/checkpoints/step_00000003/model.pt", 100);  // truncated
  SignallingBatches resumed(stopped, -1);
  ASSERT_EQ(pretrain(stopped, PretrainOptions{}, resumed, xlme::testing::single_process()),
            kExitOk);
  auto a = final_model(straight);
  auto b = final_model(stopped);
  xlme::testing::expect_same_parameters(a, b, /*atol=*/0);
}

// The value of `key` in the metrics line of `step`.
double logged(const std::string& metrics_file, int64_t step, const std::string& key) {
  std::istringstream lines(read_file(metrics_file));
  const std::string prefix = "{\"step\": " + std::to_string(step) + ",";
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) != 0) continue;
    const auto at = line.find("\"" + key + "\": ");
    if (at == std::string::npos) break;
    return std::stod(line.substr(at + key.size() + 4));
  }
  ADD_FAILURE() << key << " of step " << step << " not in " << metrics_file;
  return 0;
}

TEST(Pretrain, LoggedStatisticsPoolTheWholeInterval) {
  TempDir dir;
  auto every_step = run_config(dir / "every", 0);
  auto every_other = run_config(dir / "other", 0);
  every_other.train.log_every = 2;
  SignallingBatches a(every_step, -1), b(every_other, -1);
  ASSERT_EQ(pretrain(every_step, PretrainOptions{}, a, xlme::testing::single_process()), kExitOk);
  ASSERT_EQ(pretrain(every_other, PretrainOptions{}, b, xlme::testing::single_process()), kExitOk);
  int differing = 0;  // keys whose steps 3 and 4 differ
  for (const char* key : {"loss/mlm", "loss/mrtd", "accuracy/mrtd"}) {
    const double step3 = logged(dir / "every/metrics.jsonl", 3, key);
    const double step4 = logged(dir / "every/metrics.jsonl", 4, key);
    const double pooled = logged(dir / "other/metrics.jsonl", 4, key);
    // Steps 3 and 4 pooled: between the two, and not simply step 4's value (where the two steps
    // differ: an accuracy over a few tokens can be the same fraction in both).
    EXPECT_GE(pooled, std::min(step3, step4) - 1e-12) << key;
    EXPECT_LE(pooled, std::max(step3, step4) + 1e-12) << key;
    if (step3 == step4) continue;
    ++differing;
    EXPECT_NE(pooled, step4) << key;
  }
  EXPECT_GE(differing, 2) << "the two losses of steps 3 and 4 should differ";
}

}  // namespace
}  // namespace xlme::train
