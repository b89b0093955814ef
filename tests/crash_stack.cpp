// A test process that dies of a fatal signal prints its stack first, so that a crash on a machine
// nobody can log into (a lent GPU: scripts/gpu_check.sh brings back only the logs) names its
// place. The symbols are readable because the test executables export theirs (-rdynamic).
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <initializer_list>

namespace {

void print_stack_and_die(int signal) {
  static const char kHeader[] = "\n*** fatal signal in an xlme test process; its stack:\n";
  (void)!::write(STDERR_FILENO, kHeader, sizeof kHeader - 1);
  void* frames[64];
  const int count = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

const bool kInstalled = [] {
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc's unwinder now: it allocates, which a handler must not
  for (const int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    std::signal(signal, print_stack_and_die);
  }
  return true;
}();

}  // namespace
