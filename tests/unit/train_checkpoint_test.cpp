// Checkpoint folders: atomic save, verification of each damage kind, newest-valid selection,
// pruning, and a failed save that leaves everything as it was.
#include "xlme/train/checkpoint.h"

#include "test_util.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>

namespace xlme::train {
namespace {

namespace fs = std::filesystem;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

void write_parts(const std::string& folder, int64_t step) {
  write_file(folder + "/model.bin", std::string(1000 + step, static_cast<char>('a' + step % 26)));
  write_file(folder + "/rank0.state", "step " + std::to_string(step));
}

TEST(Checkpoint, Crc32MatchesZlibOnTheWholeBuffer) {
  TempDir dir;
  std::string data(3 << 20, '\0');  // larger than the 1 MiB read chunk
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  write_file(dir / "f", data);
  EXPECT_EQ(file_crc32(dir / "f"),
            crc32_z(0, reinterpret_cast<const Bytef*>(data.data()), data.size()));
  write_file(dir / "abc", "123456789");
  EXPECT_EQ(file_crc32(dir / "abc"), 0xCBF43926u);  // the CRC-32 check value
}

TEST(Checkpoint, SaveWritesAVerifiedFolderWithAManifest) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 3, 0);
  const std::string path = manager.save(200, [](const std::string& f) { write_parts(f, 200); });
  EXPECT_EQ(path, dir / "ckpt/step_00000200");
  EXPECT_NO_THROW(CheckpointManager::verify(path));
  EXPECT_TRUE(contains_all(read_file(path + "/manifest.yaml"),
                           {"format: xlme-checkpoint", "step: 200", "model.bin: {bytes: 1200"}));
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_00000200.tmp"));
  const auto latest = manager.latest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 200);
}

// A manifest that gives a key twice (yaml-cpp keeps the last) is a damaged manifest: named with
// both lines by verify, skipped by latest_valid.
TEST(Checkpoint, ManifestWithADuplicateKeyIsRefusedNamingBothLines) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 10, 0);
  for (int64_t step : {100, 200}) {
    manager.save(step, [&](const std::string& f) { write_parts(f, step); });
  }
  const std::string manifest = dir / "ckpt/step_00000200/manifest.yaml";
  write_file(manifest, read_file(manifest) + "step: 999\n");
  EXPECT_TRUE(contains_all(
      error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000200"); }),
      {manifest, "key 'step' is given twice in the same map"}));
  const auto latest = manager.latest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 100);
}

TEST(Checkpoint, DamagedCheckpointsAreSkippedWithTheReason) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 10, 0);
  for (int64_t step : {100, 200, 300, 400}) {
    manager.save(step, [&](const std::string& f) { write_parts(f, step); });
  }
  // 400: truncated model; 300: one flipped byte; 200: manifest lost. 100 is intact.
  fs::resize_file(dir / "ckpt/step_00000400/model.bin", 10);
  std::string model = read_file(dir / "ckpt/step_00000300/model.bin");
  model[7] ^= 1;
  write_file(dir / "ckpt/step_00000300/model.bin", model);
  fs::remove(dir / "ckpt/step_00000200/manifest.yaml");

  EXPECT_TRUE(
      contains_all(error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000400"); }),
                   {"step_00000400': model.bin is truncated: expected 1400 bytes, found 10"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000300"); }),
                   {"step_00000300': model.bin is corrupted: CRC32"}));
  EXPECT_TRUE(
      contains_all(error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000200"); }),
                   {"has no manifest.yaml: its save did not finish"}));
  fs::remove(dir / "ckpt/step_00000100/rank0.state");
  EXPECT_TRUE(
      contains_all(error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000100"); }),
                   {"step_00000100': rank0.state is missing"}));
  EXPECT_FALSE(manager.latest_valid().has_value());

  manager.save(500, [&](const std::string& f) { write_parts(f, 500); });
  EXPECT_EQ(manager.latest_valid()->step, 500);
}

TEST(Checkpoint, InterruptedSavesAreIgnoredAndCleanedUp) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 3, 0);
  manager.save(100, [](const std::string& f) { write_parts(f, 100); });
  write_parts(manager.begin(200), 200);  // the process died before commit()
  EXPECT_EQ(manager.latest_valid()->step, 100);
  EXPECT_EQ(manager.list().size(), 1u);
  manager.remove_temporaries();
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_00000200.tmp"));
}

TEST(Checkpoint, FailedWriteLeavesEarlierCheckpointsAlone) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 1, 0);
  manager.save(100, [](const std::string& f) { write_parts(f, 100); });
  EXPECT_THROW(manager.save(200,
                            [](const std::string& f) {
                              write_parts(f, 200);
                              throw std::runtime_error("disk full");
                            }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_00000200.tmp"));
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_00000200"));
  EXPECT_NO_THROW(CheckpointManager::verify(dir / "ckpt/step_00000100"));
}

TEST(Checkpoint, PruningKeepsTheNewestAndEveryKeepEvery) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", /*keep_last=*/2, /*keep_every=*/300);
  for (int64_t step = 100; step <= 800; step += 100) {
    manager.save(step, [&](const std::string& f) { write_parts(f, step); });
  }
  std::vector<int64_t> kept;
  for (const auto& ref : manager.list()) kept.push_back(ref.step);
  EXPECT_EQ(kept, (std::vector<int64_t>{300, 600, 700, 800}));
}

}  // namespace
}  // namespace xlme::train
