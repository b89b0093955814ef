// tests/crash_stack.cpp: a test process that dies of a signal prints its stack.
#include "test_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <csignal>
#include <string>

namespace xlme::testing {

// Only run by the test below, in a child process. Outside the anonymous namespace: a function
// with internal linkage has no exported name to print.
[[gnu::noinline]] void crash_here_for_the_stack() {
  std::raise(SIGSEGV);
}

namespace {

TEST(CrashStack, DISABLED_DiesOfASignal) {
  crash_here_for_the_stack();
}

TEST(CrashStack, ADyingTestProcessPrintsItsStackNamingTheFunction) {
  TempDir dir;
  const std::string log = dir / "stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::string exe = "/proc/self/exe", filter = "--gtest_filter=CrashStack.DISABLED_DiesOfASignal",
              disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {exe.data(), filter.data(), disabled.data(), nullptr};
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  // Still killed by the signal (the handler re-raises it), so that ctest reports a crash.
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGSEGV);
  const std::string out = read_file(log);
  EXPECT_NE(out.find("fatal signal in an xlme test process"), std::string::npos) << out;
  // The mangled name of the function that raised it (exported symbols: -rdynamic).
  EXPECT_NE(out.find("crash_here_for_the_stack"), std::string::npos) << out;
}

}  // namespace
}  // namespace xlme::testing
