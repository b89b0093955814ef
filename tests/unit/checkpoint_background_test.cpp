// BackgroundSave: one checkpoint write at a time on a background thread, its error kept until
// the trainer collects it.
#include "xlme/checkpoint/background.h"

#include "xlme/common/error.h"

#include "test_util.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

namespace xlme::checkpoint {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

TEST(BackgroundSave, AtMostOneSaveIsInFlight) {
  BackgroundSave saves;
  EXPECT_FALSE(saves.in_flight());
  EXPECT_FALSE(saves.wait().has_value());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> running{0};
  saves.start(4, [&] {
    ++running;
    released.wait();
    return std::string("ckpt/step_00000004");
  });
  EXPECT_TRUE(saves.in_flight());
  EXPECT_EQ(saves.step(), 4);
  // A second save while the first is written is refused, and nothing of it runs.
  EXPECT_TRUE(contains_all(
      error_message([&] { saves.start(5, [] { return std::string(); }); }),
      {"checkpoint of step 5", "step 4 is being written", "at most one save is in flight"}));
  release.set_value();
  EXPECT_EQ(saves.wait().value_or(""), "ckpt/step_00000004");
  EXPECT_EQ(running.load(), 1);
  EXPECT_FALSE(saves.in_flight());
  saves.start(5, [] { return std::string("ckpt/step_00000005"); });
  EXPECT_EQ(saves.wait().value_or(""), "ckpt/step_00000005");
}

TEST(BackgroundSave, AnErrorIsSeenWithoutWaitingAndRethrownByWait) {
  BackgroundSave saves;
  saves.start(7, []() -> std::string { XLME_FAIL("cannot write 'ckpt/step_00000007.tmp/x'"); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!saves.failed() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(saves.failed());
  EXPECT_EQ(error_message([&] { saves.wait(); }), "cannot write 'ckpt/step_00000007.tmp/x'");
  EXPECT_FALSE(saves.failed());
  EXPECT_FALSE(saves.in_flight());
}

TEST(BackgroundSave, DestructionWaitsForTheSaveInFlight) {
  std::atomic<bool> finished{false};
  {
    BackgroundSave saves;
    saves.start(1, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      finished = true;
      return std::string("done");
    });
  }
  EXPECT_TRUE(finished.load());
}

}  // namespace
}  // namespace xlme::checkpoint
