#include "xlme/train/signals.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>

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
  // SIGUSR2 and SIGXCPU: the warnings batch systems send before a kill (Grid Engine's -notify
  // before SIGKILL; a CPU-time limit's soft limit before its hard one).
  for (const int signal : {SIGTERM, SIGINT, SIGUSR1, SIGHUP, SIGUSR2, SIGXCPU})
    sigaction(signal, &action, nullptr);
  // A console that goes away (`| tee` or `| head` ended) makes writes to it fail instead of
  // killing the run: the rank's log file records everything.
  std::signal(SIGPIPE, SIG_IGN);
}

int stop_signal() {
  return g_stop_signal.load();
}

void clear_stop_signal() {
  g_stop_signal.store(0);
}

void record_exit_code(int code) {
  const char* dir = std::getenv("XLME_EXIT_STATUS_DIR");
  if (dir == nullptr || *dir == '\0') return;
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) rank = std::getenv("SLURM_PROCID");
  const std::string name =
      rank != nullptr ? fmt::format("rank{}", rank) : fmt::format("pid{}", ::getpid());
  // Written aside and renamed, so that the wrapper never reads half a file.
  const std::string path = fmt::format("{}/{}", dir, name);
  {
    std::ofstream out(path + ".tmp");
    out << code << "\n";
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

}  // namespace xlme::train
