// The stop-signal flag (SIGTERM, SIGINT, SIGUSR1 set it instead of killing the process).
#include "xlme/train/signals.h"

#include "test_util.h"

#include <csignal>

namespace xlme::train {
namespace {

TEST(StopSignals, SetTheFlagInsteadOfKilling) {
  install_stop_signal_handlers();
  clear_stop_signal();
  EXPECT_EQ(stop_signal(), 0);
  std::raise(SIGUSR1);
  EXPECT_EQ(stop_signal(), SIGUSR1);
  std::raise(SIGTERM);
  EXPECT_EQ(stop_signal(), SIGTERM);
  clear_stop_signal();
  EXPECT_EQ(stop_signal(), 0);
}

}  // namespace
}  // namespace xlme::train
