#include "xlme/train/signals.h"

#include <atomic>
#include <csignal>
#include <initializer_list>

namespace xlme::train {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

void on_stop_signal(int signal) {
  g_stop_signal.store(signal);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1}) sigaction(signal, &action, nullptr);
}

int stop_signal() {
  return g_stop_signal.load();
}

void clear_stop_signal() {
  g_stop_signal.store(0);
}

}  // namespace xlme::train
