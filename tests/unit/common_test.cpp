// common: XLME_CHECK, file reads and atomic writes, checksums, logging set-up, threads and the
// BLAS check.
#include "xlme/common/checksum.h"
#include "xlme/common/error.h"
#include "xlme/common/io.h"
#include "xlme/common/logging.h"
#include "xlme/common/runtime.h"
#include "xlme/common/shape_text.h"

#include "test_util.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>

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

// Files a command creates or appends to are never written through a link planted at their name:
// a symbolic link's target and a hard link's other name keep their bytes, and the error names
// the path.
TEST(OwnFile, LinksPlantedAtTheNameAreRefusedAndTheirTargetsKept) {
  TempDir dir;
  const std::string target = dir / "users_file";
  write_file(target, "precious");
  const std::string symlink = dir / "shard.bin.partial";
  std::filesystem::create_symlink(target, symlink);
  for (const uint64_t keep : {uint64_t{0}, uint64_t{3}}) {
    const std::string error = error_message([&] { open_own_file(symlink, keep, "the shard"); });
    EXPECT_TRUE(contains_all(error, {"the shard", symlink, "symbolic link"})) << error;
  }
  const std::string hard = dir / "other.partial";
  std::filesystem::create_hard_link(target, hard);
  const std::string error = error_message([&] { open_own_file(hard, 0, "the shard"); });
  EXPECT_TRUE(contains_all(error, {"the shard", hard, "2 hard links"})) << error;
  const std::string created = error_message([&] { create_own_file(hard, "the sample"); });
  EXPECT_TRUE(contains_all(created, {"the sample", hard, "2 hard links"})) << created;
  const std::string through = error_message([&] { create_own_file(symlink, "the sample"); });
  EXPECT_TRUE(contains_all(through, {"the sample", symlink, "symbolic link"})) << through;
  EXPECT_EQ(read_file(target), "precious");
  // A lock file hard-linked to a user's file is refused too.
  const std::string lock = error_message([&] { FileLock l(hard, "the run folder"); });
  EXPECT_TRUE(contains_all(lock, {"lock file of the run folder", hard, "hard links"})) << lock;
  EXPECT_EQ(read_file(target), "precious");
}

TEST(OwnFile, CreatesEmptiesOrCutsAFileOfItsOwn) {
  TempDir dir;
  const std::string path = dir / "a.partial";
  int fd = open_own_file(path, 0, "the shard");
  ASSERT_EQ(::write(fd, "abcdef", 6), 6);
  ::close(fd);
  fd = open_own_file(path, 4, "the shard");  // a resume: cut to the checkpoint, then append
  ASSERT_EQ(::write(fd, "XY", 2), 2);
  ::close(fd);
  EXPECT_EQ(read_file(path), "abcdXY");
  const std::string short_file = error_message([&] { open_own_file(path, 99, "the shard"); });
  EXPECT_TRUE(contains_all(short_file, {"cannot resume", path, "6 bytes", "99 bytes"}))
      << short_file;
  EXPECT_EQ(read_file(path), "abcdXY");
  fd = open_own_file(path, 0, "the shard");  // a new run empties it
  ::close(fd);
  EXPECT_EQ(read_file(path), "");
  // create_own_file replaces a plain file an earlier process left.
  write_file(path, "stale");
  fd = create_own_file(path, "the sample");
  ASSERT_EQ(::write(fd, "new", 3), 3);
  ::close(fd);
  EXPECT_EQ(read_file(path), "new");
}

TEST(ReadFile, ReturnsEveryByteOfTheFile) {
  TempDir dir;
  std::string binary;
  for (int round = 0; round < 600; ++round) {  // 150 KiB: more than one 64 KiB read
    for (int byte = 0; byte < 256; ++byte) binary.push_back(static_cast<char>(byte));
  }
  write_file(dir / "binary", binary);
  EXPECT_EQ(xlme::read_file(dir / "binary"), binary);
  write_file(dir / "empty", "");
  EXPECT_EQ(xlme::read_file(dir / "empty"), "");
  write_file(dir / "text", "line one\r\nline two\n");
  EXPECT_EQ(xlme::read_file(dir / "text", "tokenizer"), "line one\r\nline two\n");
}

TEST(ReadFile, ErrorsNameWhatTheFileTheReasonAndTheRemedy) {
  TempDir dir;
  EXPECT_EQ(error_message([&] { xlme::read_file(dir / "missing.model", "tokenizer"); }),
            "cannot read tokenizer '" + (dir / "missing.model") +
                "': No such file or directory; check the path and the file's permissions");
  EXPECT_TRUE(contains_all(error_message([&] { xlme::read_file(dir / "missing"); }),
                           {"cannot read file '" + (dir / "missing") + "'"}));
  std::filesystem::create_directories(dir / "folder");
  EXPECT_TRUE(contains_all(error_message([&] { xlme::read_file(dir / "folder", ".mo file"); }),
                           {"cannot read .mo file '" + (dir / "folder") +
                            "': it is a folder, not a "
                            "regular file"}));
  // A FIFO without a writer is refused at once, not waited on.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  EXPECT_TRUE(contains_all(error_message([&] { xlme::read_file(dir / "fifo"); }),
                           {"'" + (dir / "fifo") + "': it is a FIFO (named pipe)"}));
}

TEST(Checksum, Crc32IsZlibsInOneCallInPiecesAndOfAFile) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32_update(0, check.data(), check.size()), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(crc32_update(0, nullptr, 0), 0u);
  std::string data(3 << 20, '\0');  // larger than file_crc32's 1 MiB read chunk
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  const uint32_t whole = crc32_update(0, data.data(), data.size());
  EXPECT_EQ(whole, crc32_z(0, reinterpret_cast<const Bytef*>(data.data()), data.size()));
  uint32_t pieces = 0;
  for (std::size_t at = 0, piece = 1; at < data.size(); at += piece, piece = piece * 3 + 1) {
    piece = std::min(piece, data.size() - at);
    pieces = crc32_update(pieces, data.data() + at, piece);
  }
  EXPECT_EQ(pieces, whole);
  TempDir dir;
  write_file(dir / "f", data);
  EXPECT_EQ(file_crc32(dir / "f"), whole);
  write_file(dir / "check", check);
  EXPECT_EQ(file_crc32(dir / "check"), 0xCBF43926u);
  write_file(dir / "empty", "");
  EXPECT_EQ(file_crc32(dir / "empty"), 0u);
  EXPECT_TRUE(contains_all(error_message([&] { file_crc32(dir / "missing"); }),
                           {"cannot read '" + (dir / "missing") + "'", "No such file"}));
}

TEST(Checksum, Hash64KeepsTheValuesThatShardsAndHeldOutSplitsRecord) {
  // Computed by the code before it moved here (data/text.cpp): shard headers identify their
  // tokenizer by hash64, and the demo corpus's held-out split is hash64 % 1000.
  std::string bytes;
  for (int byte = 0; byte < 256; ++byte) bytes.push_back(static_cast<char>(byte));
  EXPECT_EQ(hash64(""), 0xf52a15e9a9b5e89bull);
  EXPECT_EQ(hash64("123456789"), 0x4de1f3eb9eff0433ull);
  EXPECT_EQ(hash64("model bytes|own"), 0x706cf5b079910082ull);
  EXPECT_EQ(hash64(bytes), 0xef2687f0d4371fe2ull);
}

TEST(ShapeText, ListsTheSizesInBrackets) {
  EXPECT_EQ(shape_text(std::vector<int64_t>{2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(shape_text(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(shape_text(torch::zeros({5, 0, 1099511627776LL}, torch::kUInt8).sizes()),
            "[5, 0, 1099511627776]");
  EXPECT_EQ(shape_text(torch::tensor(1.5).sizes()), "[]");
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

// Sets (or, with nullptr, unsets) one environment variable for its scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(Runtime, ThreadsDefaultToAllAvailableCores) {
  const ScopedEnv no_omp("OMP_NUM_THREADS", nullptr);
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

// run.threads=0 under a launcher that shares the node's cores out (OMP_NUM_THREADS per rank):
// 8 ranks on a node must not each take every core. run.threads itself wins.
TEST(Runtime, ThreadsZeroHonoursOmpNumThreads) {
  {
    const ScopedEnv omp("OMP_NUM_THREADS", "1");
    runtime::ThreadSettings s = runtime::configure_threads(0);
    EXPECT_EQ(s.intra_op, 1);
    EXPECT_EQ(s.source, "OMP_NUM_THREADS");
    EXPECT_EQ(at::get_num_threads(), 1);
    s = runtime::configure_threads(2);
    EXPECT_EQ(s.intra_op, 2);
    EXPECT_EQ(s.source, "run.threads");
  }
  {
    const ScopedEnv omp("OMP_NUM_THREADS", "3,1");  // one count per OpenMP nesting level
    EXPECT_EQ(runtime::configure_threads(0).intra_op, 3);
  }
  for (const char* bad : {"0", "all", "2x"}) {
    const ScopedEnv omp("OMP_NUM_THREADS", bad);
    EXPECT_TRUE(contains_all(error_message([] { runtime::configure_threads(0); }),
                             {"OMP_NUM_THREADS='" + std::string(bad) + "' is not a thread count"}))
        << bad;
  }
  const ScopedEnv no_omp("OMP_NUM_THREADS", nullptr);
  EXPECT_EQ(runtime::configure_threads(0).source, "every available core");
}

// at::parallel_for in xlme's own code (dropout masks, the position bias, attention's batched
// products, sampling) runs in parallel only when xlme is compiled with OpenMP: without it, the
// pragma in LibTorch's header is dropped and every loop runs on one thread, with no error.
TEST(Runtime, OwnParallelLoopsRunOnEveryLibTorchThread) {
  for (const int threads : {1, 2, 3}) {
    const runtime::ThreadSettings s = runtime::configure_threads(threads);
    EXPECT_EQ(s.own_loops, threads);
    EXPECT_EQ(runtime::parallel_loop_threads(), threads);
  }
  // Inside a parallel region, nested loops run on the calling thread.
  std::vector<int> nested(2, 0);
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      nested[static_cast<size_t>(i)] = runtime::parallel_loop_threads();
  });
  EXPECT_EQ(nested, (std::vector<int>{1, 1}));
  runtime::configure_threads(0);
}

TEST(Runtime, TheStandardLibraryIsLibstdcxxNotLibTorchsCopies) {
  // LibTorch's libraries export copies of libstdc++ functions; when they came first in the
  // search order, every std::filesystem::remove_all ran LibTorch's copy and crashed
  // (CMakeLists.txt names libstdc++ first). Where this process binds that one:
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);
  const auto remove_all = static_cast<RemoveAll>(&std::filesystem::remove_all);
  Dl_info where{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(remove_all), &where), 0);
  EXPECT_TRUE(contains_all(where.dli_fname, {"libstdc++.so"})) << where.dli_fname;
  // And it works: a folder with a file in it goes.
  TempDir dir;
  write_file(dir / "a/b.txt", "x");
  std::error_code ec;
  EXPECT_EQ(std::filesystem::remove_all(dir / "a", ec), 2u) << ec.message();
}

TEST(Runtime, LibTorchsBlasIsMklOnX86) {
  // PyPI's x86-64 torch wheels link MKL into libtorch_cpu; the start-up line names it.
#if defined(__x86_64__)
  EXPECT_TRUE(at::hasMKL());
  EXPECT_EQ(runtime::blas_name(), "MKL, linked into LibTorch");
#else
  EXPECT_FALSE(runtime::blas_name().empty());
#endif
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

TEST(Runtime, BuildDescriptionNamesTheLibTorchItWasBuiltAgainst) {
  // The one LibTorch xlme builds against (CMakeLists.txt refuses older ones).
  EXPECT_TRUE(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11))
      << TORCH_VERSION;
  EXPECT_TRUE(contains_all(runtime::build_description(), {"LibTorch " TORCH_VERSION}));
}

}  // namespace
}  // namespace xlme
