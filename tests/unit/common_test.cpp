// common: XLME_CHECK, atomic file writes, logging set-up, threads and the BLAS check.
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/logging.h"
#include "xlme/common/runtime.h"
#include "xlme/common/torch_compat.h"

#include "test_util.h"

#include <torch/torch.h>

#include <filesystem>

namespace xlme {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

TEST(Check, FormatsTheMessageAndRecordsTheSourceLine) {
  const int line = __LINE__ + 2;
  try {
    XLME_CHECK(1 + 1 == 3, "shard {} is truncated: expected {} bytes, found {}", "de.bin", 81920,
               4096);
    FAIL() << "XLME_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "shard de.bin is truncated: expected 81920 bytes, found 4096");
    EXPECT_EQ(e.location(), "tests/unit/common_test.cpp:" + std::to_string(line));
  }
}

TEST(Check, PassesWithoutEvaluatingTheMessage) {
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  XLME_CHECK(true, "never formatted {}", count());
  EXPECT_EQ(evaluated, 0);
  EXPECT_EQ(error_message([] { XLME_FAIL("value {} is bad", 7); }), "value 7 is bad");
}

TEST(AtomicWrite, CreatesReplacesAndLeavesNoTemporaryFile) {
  TempDir dir;
  const std::string path = dir / "a/b/config.yaml";
  write_file_atomic(path, "first\n");
  EXPECT_EQ(read_file(path), "first\n");
  write_file_atomic(path, std::string(1 << 20, 'x'));
  EXPECT_EQ(read_file(path), std::string(1 << 20, 'x'));
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "a/b")) {
    EXPECT_EQ(entry.path().filename(), "config.yaml");
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(AtomicWrite, FailureNamesThePathAndKeepsTheOldFile) {
  TempDir dir;
  write_file(dir / "blocker", "a file, not a folder");
  EXPECT_TRUE(contains_all(error_message([&] { write_file_atomic(dir / "blocker/x.yaml", "y"); }),
                           {"cannot create folder '" + (dir / "blocker") + "'"}));
  EXPECT_EQ(read_file(dir / "blocker"), "a file, not a folder");
  // The target is a folder: the rename fails, the folder and its content survive.
  write_file(dir / "target/keep.txt", "keep");
  EXPECT_TRUE(contains_all(error_message([&] { write_file_atomic(dir / "target", "new"); }),
                           {"cannot rename", dir / "target"}));
  EXPECT_EQ(read_file(dir / "target/keep.txt"), "keep");
  EXPECT_FALSE(std::filesystem::exists(dir / "target.tmp-" + std::to_string(getpid())));
}

TEST(Logging, WritesOneFilePerRankAtTheConfiguredLevel) {
  TempDir dir;
  const std::string file = logging::init({"info", /*rank=*/3, dir / "logs"});
  EXPECT_EQ(file, dir / "logs/rank3.log");
  spdlog::info("hello from rank {}", 3);
  spdlog::debug("below the level");
  spdlog::default_logger()->flush();
  const std::string log = read_file(file);
  EXPECT_TRUE(contains_all(log, {"[info] hello from rank 3"}));
  EXPECT_EQ(log.find("below the level"), std::string::npos);
  logging::init({"warn", 0, ""});  // console only again
}

TEST(Logging, UnknownLevelListsTheValidOnes) {
  EXPECT_TRUE(contains_all(error_message([] { logging::parse_level("loud"); }),
                           {"unknown log level 'loud'", "trace, debug, info, warn, error, off"}));
  EXPECT_EQ(logging::parse_level("debug"), spdlog::level::debug);
}

TEST(Runtime, ThreadsDefaultToAllAvailableCores) {
  const int cores = runtime::available_cores();
  EXPECT_GE(cores, 1);
  runtime::ThreadSettings s = runtime::configure_threads(0);
  EXPECT_EQ(s.intra_op, cores);
  EXPECT_EQ(at::get_num_threads(), cores);
  s = runtime::configure_threads(1);
  EXPECT_EQ(s.intra_op, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  runtime::configure_threads(0);
}

TEST(Runtime, LibTorchUsesAnOptimizedBlas) {
  // scripts/setup.sh installs libopenblas0-pthread; the reference BLAS here would make every
  // matrix product ~15x slower. The integration test checks that the reference one is reported.
  const runtime::BlasInfo blas = runtime::detect_blas();
  EXPECT_FALSE(blas.reference) << blas.name << " at " << blas.library;
  EXPECT_FALSE(blas.name.empty());
  if (!blas.library.empty()) {
    EXPECT_EQ(blas.name, "OpenBLAS") << blas.library;
  }
}

TEST(Runtime, ReleaseFreeMemoryTrimsTheGlibcHeapAndKeepsLiveTensors) {
  // The trainer relies on it after each CPU step; a silent no-op here (the glibc branch compiled
  // out) would bring back the resident set growing with the free, fragmented heap.
  auto kept = torch::arange(1 << 16, torch::kFloat32);
  for (int64_t i = 0; i < 64; ++i) {
    const auto dropped = torch::ones({1000 + 37 * i, 16});  // freed at once, of changing sizes
    EXPECT_EQ(dropped.size(0), 1000 + 37 * i);
  }
#if defined(__GLIBC__)
  EXPECT_TRUE(runtime::release_free_memory());
#else
  EXPECT_FALSE(runtime::release_free_memory());
#endif
  EXPECT_TRUE(kept.equal(torch::arange(1 << 16, torch::kFloat32)));
}

TEST(Runtime, PreloadWithAppendsOnceAndKeepsTheUsersLibraries) {
  const std::string tc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";
  EXPECT_EQ(runtime::preload_with("", tc), tc);
  EXPECT_EQ(runtime::preload_with("libfoo.so", tc), "libfoo.so:" + tc);
  EXPECT_EQ(runtime::preload_with("libfoo.so:" + tc, tc), "libfoo.so:" + tc);  // already there
  EXPECT_EQ(runtime::preload_with(tc + " libfoo.so", tc), tc + " libfoo.so");  // space-separated
  // A longer name that merely starts with the library's path is another library.
  EXPECT_EQ(runtime::preload_with(tc + ".5.10", tc), tc + ".5.10:" + tc);
}

TEST(TorchCompat, VersionMacrosMatchTheLibrary) {
  EXPECT_TRUE(XLME_TORCH_AT_LEAST(1, 13));
  EXPECT_FALSE(XLME_TORCH_AT_LEAST(TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR + 1));
  EXPECT_EQ(compat::kHasScaledDotProductAttention, TORCH_VERSION_MAJOR >= 2);
  EXPECT_TRUE(contains_all(runtime::build_description(), {"LibTorch " TORCH_VERSION}));
}

}  // namespace
}  // namespace xlme
