// The four binaries as a user runs them: --help, --version, --print-config (read back through the
// config loader), overrides, errors with their exit codes, log files, the OpenMP wait policy, the
// preloaded allocator, and a run without a GPU that says so without CUDA warnings.
#include "xlme/common/runtime.h"
#include "xlme/config/config.h"

#include "test_util.h"

#include <sys/wait.h>
#include <torch/cuda.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace xlme {
namespace {

using xlme::testing::contains_all;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

const char* const kTools[] = {"xlme-data", "xlme-pretrain", "xlme-finetune", "xlme-export"};

using Result = xlme::testing::ToolRun;
using xlme::testing::quote;

Result run(const std::string& tool, const std::vector<std::string>& args,
           const std::string& env = "") {
  return xlme::testing::run_tool(tool, args, env);
}

TEST(Cli, EveryBinaryAnswersHelp) {
  for (const char* tool : kTools) {
    SCOPED_TRACE(tool);
    const Result r = run(tool, {"--help"});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains_all(
        r.out, {tool, "--config FILE", "--set KEY=VALUE", "--print-config", "--log-level",
                "--threads", "--version", "XLME_ALLOCATOR", "Exit codes"}));
    // Every exit code a binary can return, and no retired one (3 meant "not implemented yet").
    EXPECT_TRUE(contains_all(r.out, {"0 success", "1 error", "2 bad command line", "75 stopped"}));
    EXPECT_EQ(r.out.find("not implemented"), std::string::npos);
  }
}

TEST(Cli, EveryBinaryPrintsAConfigThatLoadsBackIdentically) {
  TempDir dir;
  for (const char* tool : kTools) {
    SCOPED_TRACE(tool);
    const Result r = run(tool, {"--config", "configs/pretrain/demo.yaml", "--print-config", "--set",
                                "train.lr=2.5e-4", "--threads", "1"});
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains_all(r.out, {"lr: 0.00025", "threads: 1", "# peak learning rate"}));
    write_file(dir / "printed.yaml", r.out);
    const config::Config expected =
        config::load_config(std::string(XLME_SOURCE_DIR) + "/configs/pretrain/demo.yaml",
                            {"train.lr=2.5e-4", "run.threads=1"});
    EXPECT_EQ(config::to_yaml(config::load_config(dir / "printed.yaml")),
              config::to_yaml(expected));
  }
}

TEST(Cli, PrintConfigWithoutAFileGivesTheDefaults) {
  const Result r = run("xlme-export", {"--print-config"});
  ASSERT_EQ(r.code, 0) << r.err;
  TempDir dir;
  write_file(dir / "defaults.yaml", r.out);
  EXPECT_EQ(config::to_yaml(config::load_config(dir / "defaults.yaml")),
            config::to_yaml(config::load_config("")));
}

TEST(Cli, ConfigErrorsExitWithOneAndAMessage) {
  Result r = run("xlme-pretrain", {"--config", "configs/pretrain/demo.yaml", "--set",
                                   "model.hiden_size=3", "--print-config"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"xlme-pretrain: error: --set model.hiden_size=3: unknown key "
                                   "'model.hiden_size' (did you mean 'model.hidden_size'?)"}));
  EXPECT_EQ(r.out, "");
  r = run("xlme-finetune", {"--config", "configs/nope.yaml"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"config file 'configs/nope.yaml' not found"}));
  r = run("xlme-data", {"--log-level", "loud", "--print-config"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"run.log_level: expected one of: trace, debug, info, warn, "
                                   "error, off, got 'loud'"}));
}

TEST(Cli, BadCommandLineExitsWithTwo) {
  const Result r = run("xlme-export", {"--no-such-flag"});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains_all(r.err, {"--no-such-flag"}));
}

TEST(Cli, VersionNamesLibTorch) {
  const Result r = run("xlme-pretrain", {"--version"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.out, {"xlme " XLME_VERSION, "LibTorch"}));
}

TEST(Cli, AJobThatFailsSaysWhyAndExitsWithOne) {
  TempDir dir;
  const Result r = run("xlme-finetune", {"--config", "configs/finetune/xnli.yaml", "--set",
                                         "run.out_dir=" + (dir / "run")});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"finetune.init is empty"}));
  // The run folder holds rank 0's log, with the start-up lines and the error.
  EXPECT_TRUE(contains_all(read_file(dir / "run/logs/rank0.log"),
                           {"xlme-finetune - xlme", "threads: ", "finetune.init is empty"}));
}

TEST(Cli, OtherRanksLogToTheirFileAndKeepTheConsoleForErrors) {
  TempDir dir;
  const Result r = run("xlme-finetune", {"--set", "run.out_dir=" + (dir / "run")},
                       "RANK=2 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err.find("threads:"), std::string::npos) << r.err;  // info lines stay in the file
  EXPECT_TRUE(contains_all(r.err, {"[rank 2]", "finetune.init is empty"}));
  EXPECT_TRUE(contains_all(read_file(dir / "run/logs/rank2.log"), {"threads: "}));
  EXPECT_FALSE(std::filesystem::exists(dir / "run/logs/rank0.log"));
}

TEST(Cli, PassiveOpenMpWaitPolicyUnlessTheUserSetsOne) {
  Result r = run("xlme-export", {"--threads", "2"}, "env -u OMP_WAIT_POLICY");
  // "2 in xlme's own loops": the binary's own at::parallel_for runs on both threads (compiled
  // with OpenMP).
  EXPECT_TRUE(contains_all(r.err, {"threads: 2 LibTorch (from run.threads; 2 in xlme's own loops)",
                                   "OMP_WAIT_POLICY=PASSIVE"}));
  r = run("xlme-export", {}, "OMP_WAIT_POLICY=ACTIVE");
  EXPECT_TRUE(contains_all(r.err, {"OMP_WAIT_POLICY=ACTIVE"}));
}

// The binaries preload tcmalloc themselves (one re-execution, with the OpenMP wait policy): the
// start-up line names the library that serves malloc, found by where the process's `malloc`
// symbol lives.
TEST(Cli, TcmallocServesMallocUnlessOptedOut) {
  const std::string tcmalloc = runtime::tcmalloc_library();
  if (tcmalloc.empty()) GTEST_SKIP() << "libtcmalloc-minimal4 is not installed";
  const std::string clean = "env -u XLME_ALLOCATOR -u LD_PRELOAD ";
  // Started without any of the variables, and with only the wait policy already set.
  for (const std::string env : {"-u OMP_WAIT_POLICY", "OMP_WAIT_POLICY=PASSIVE"}) {
    const Result r = run("xlme-export", {}, clean + env);
    EXPECT_TRUE(contains_all(
        r.err, {"OMP_WAIT_POLICY=PASSIVE", "allocator: tcmalloc (", "libtcmalloc_minimal.so.4"}))
        << env << "\n"
        << r.err;
  }
  // A user's LD_PRELOAD is kept, tcmalloc appended after it.
  Result r = run("xlme-export", {}, clean + "LD_PRELOAD=libz.so.1");
  EXPECT_TRUE(contains_all(r.err, {"allocator: tcmalloc ("})) << r.err;
  r = run("xlme-export", {}, clean + "XLME_ALLOCATOR=system");
  EXPECT_TRUE(contains_all(r.err, {"allocator: glibc malloc (XLME_ALLOCATOR=system)"})) << r.err;
  r = run("xlme-export", {}, clean + "XLME_ALLOCATOR=jemalloc");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains_all(r.err, {"XLME_ALLOCATOR must be tcmalloc", "system", "'jemalloc'"}))
      << r.err;
}

TEST(Cli, WithoutAGpuRunsOnTheCpuQuietly) {
  // Every build has CUDA compiled in; where no GPU is visible a run goes on on the CPU, says so on
  // its start-up line, and LibTorch's CUDA probing leaves no warning in the output or the log.
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible here";
  TempDir dir;
  const Result r =
      run("xlme-pretrain", {"--config", "configs/pretrain/benchmark/cpu_tiny.yaml", "--benchmark",
                            "1", "--set", "run.out_dir=" + (dir / "run")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"(LibTorch ", ", CPU only)"})) << r.err;
  EXPECT_TRUE(contains_all(r.out, {"\"device\": \"cpu\""})) << r.out;
  const std::string log = read_file(dir / "run/logs/rank0.log");
  EXPECT_TRUE(contains_all(log, {", CPU only)"})) << log;
  for (const std::string& text : {r.out, r.err, log}) {
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::string lower = line;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const bool cuda = lower.find("cuda") != std::string::npos;
      const bool warning = lower.find("warn") != std::string::npos || line.rfind("[W", 0) == 0;
      EXPECT_FALSE(cuda && warning) << line;
    }
  }
}

}  // namespace
}  // namespace xlme
