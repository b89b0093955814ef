// The four binaries as a user runs them: --help, --version, --print-config (read back through the
// config loader), overrides, errors with their exit codes, log files, the OpenMP wait policy, the
// preloaded allocator, address-space limits, and a run without a GPU that says so without CUDA
// warnings.
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

// The bytes the loader maps for `tool`'s program and its libraries, as the build wrote them beside
// the program (src/apps/address_space.py): "<bytes> total" first.
uint64_t mapped_bytes(const std::string& tool) {
  std::istringstream in(
      read_file(std::string(XLME_BINARY_DIR) + "/libexec/" + tool + ".address-space"));
  uint64_t bytes = 0;
  std::string word;
  in >> bytes >> word;
  EXPECT_EQ(word, "total") << tool;
  return bytes;
}

std::string address_space_limit(uint64_t bytes) {
  return "ulimit -v " + std::to_string(bytes >> 10) + " &&";
}

// Under `ulimit -v` below what LibTorch with CUDA and NCCL maps, the loader itself failed ("failed
// to map segment from shared object", exit 127); each binary's front now names the limit, what the
// libraries need, the largest of them and what to do, before anything is loaded.
TEST(Cli, AnAddressSpaceLimitBelowWhatTheLibrariesMapIsRefusedNamingBoth) {
  for (const char* tool : kTools) {
    SCOPED_TRACE(tool);
    const uint64_t limit = uint64_t{1536} << 20;  // 1.5 GiB, as shared clusters set it
    ASSERT_GT(mapped_bytes(tool), limit);
    const Result r = run(tool, {"--version"}, address_space_limit(limit));
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(contains_all(
        r.err,
        {std::string(tool) + ": the address-space limit (ulimit -v) is 1.50 GiB (1572864 KiB)",
         "of libraries before it starts", "largest: lib", "libtorch_cpu.so ", "to start",
         "`ulimit -v unlimited`"}))
        << r.err;
    EXPECT_EQ(r.err.find("failed to map segment"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// The figure is the loader's real need: a program under a limit 64 MiB below it does not load, and
// every binary starts, re-executes itself with tcmalloc and runs under the limit the front asks for
// (the figure plus the front's start-up allowance).
TEST(Cli, TheAddressSpaceFigureIsWhatTheLoaderNeeds) {
  const uint64_t need = mapped_bytes("xlme-pretrain");
  const Result direct =
      run("libexec/xlme-pretrain", {"--version"}, address_space_limit(need - (uint64_t{64} << 20)));
  EXPECT_EQ(direct.code, 127) << direct.err;
  EXPECT_TRUE(contains_all(direct.err, {"failed to map segment from shared object"})) << direct.err;
  for (const char* tool : kTools) {
    SCOPED_TRACE(tool);
    const uint64_t allowed = mapped_bytes(tool) + (uint64_t{192} << 20);
    Result r = run(tool, {"--version"}, address_space_limit(allowed));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains_all(r.out, {"xlme " XLME_VERSION})) << r.out;
  }
  // Past start-up: the program re-executes itself with tcmalloc preloaded and the OpenMP wait
  // policy set, logs its start-up line, and fails on what it was asked (no checkpoint).
  const Result r = run("xlme-export", {},
                       address_space_limit(mapped_bytes("xlme-export") + (uint64_t{192} << 20)) +
                           " env -u XLME_ALLOCATOR -u LD_PRELOAD "
                           "-u OMP_WAIT_POLICY");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"OMP_WAIT_POLICY=PASSIVE", "--checkpoint"})) << r.err;
  if (!runtime::tcmalloc_library().empty()) {
    EXPECT_TRUE(contains_all(r.err, {"allocator: tcmalloc ("})) << r.err;
  }
}

// Above the start-up need a run goes on under the limit; an allocation the limit refuses fails
// with a message that names the limit, not only "can't allocate memory".
TEST(Cli, UnderAnAddressSpaceLimitARunTrainsWhereItFitsAndNamesTheLimitWhereNot) {
  const uint64_t need = mapped_bytes("xlme-pretrain");
  TempDir dir;
  Result r = run("xlme-pretrain",
                 {"--config", "configs/pretrain/benchmark/cpu_tiny.yaml", "--benchmark", "2",
                  "--set", "run.out_dir=" + (dir / "fits")},
                 address_space_limit(need + (uint64_t{1536} << 20)));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains_all(r.out, {"tokens_per_s"})) << r.out;
  // A model of ~1.6 GB in fp32 under 1 GiB of room beyond the libraries.
  r = run("xlme-pretrain",
          {"--config", "configs/pretrain/benchmark/cpu_tiny.yaml", "--benchmark", "1", "--set",
           "model.vocab_size=400000", "--set", "model.hidden_size=1024", "--set",
           "run.out_dir=" + (dir / "fails")},
          address_space_limit(need + (uint64_t{1} << 30)));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(contains_all(r.err, {"allocate",
                                   "this process runs under an address-space limit, "
                                   "ulimit -v, of ",
                                   "GiB mapped", "`ulimit -v unlimited`"}))
      << r.err;
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
