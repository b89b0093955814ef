// The stop-signal flag (the stop signals set it instead of killing the process).
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

// A hang-up and the warnings batch systems send before a kill stop the run the same way.
TEST(StopSignals, HangUpAndBatchSystemWarningsSetTheFlag) {
  install_stop_signal_handlers();
  for (const int signal : {SIGHUP, SIGUSR2, SIGXCPU}) {
    clear_stop_signal();
    std::raise(signal);
    EXPECT_EQ(stop_signal(), signal);
  }
  clear_stop_signal();
}

}  // namespace
}  // namespace xlme::train
