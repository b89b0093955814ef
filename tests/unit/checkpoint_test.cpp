// Checkpoint folders: atomic save, verification of each damage kind, newest-valid selection,
// pruning, and a failed save that leaves everything as it was; manifests and archives made to
// break the reader.
#include "xlme/checkpoint/manager.h"

#include "xlme/checkpoint/archive.h"
#include "xlme/checkpoint/layout.h"

#include "hostile_fixtures.h"
#include "test_util.h"

#include <filesystem>
#include <fstream>
#include <functional>

namespace xlme::checkpoint {
namespace {

namespace fs = std::filesystem;
using xlme::testing::archive_records;
using xlme::testing::checkpoint_entries;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::read_file;
using xlme::testing::resign_manifest;
using xlme::testing::Sentinel;
using xlme::testing::TempDir;
using xlme::testing::write_archive_records;
using xlme::testing::write_file;

void write_parts(const std::string& folder, int64_t step) {
  write_file(folder + "/model.bin", std::string(1000 + step, static_cast<char>('a' + step % 26)));
  write_file(folder + "/rank0.state", "step " + std::to_string(step));
}

// Saves a checkpoint of write_parts for each of `steps`.
void save_steps(const CheckpointManager& manager, std::initializer_list<int64_t> steps) {
  for (const int64_t step : steps) {
    manager.save(step, [&](const std::string& f) { write_parts(f, step); });
  }
}

// trainer.yaml as the trainer writes it reads back field for field; the files' names are those
// every reader opens.
TEST(Checkpoint, TrainerStateReadsBackWhatWasWritten) {
  TempDir dir;
  const std::string file = dir / kTrainerStateFile;
  write_trainer_state(file, {/*step=*/1200, /*tokens_seen=*/987654321012, /*skipped_steps=*/3,
                             /*world_size=*/4});
  EXPECT_EQ(read_file(file),
            "step: 1200\ntokens_seen: 987654321012\nskipped_steps: 3\nworld_size: 4\n");
  const TrainerState back = read_trainer_state(file);
  EXPECT_EQ(back.step, 1200);
  EXPECT_EQ(back.tokens_seen, 987654321012);
  EXPECT_EQ(back.skipped_steps, 3);
  EXPECT_EQ(back.world_size, 4);
  EXPECT_EQ(rank_file(3), "rank3.pt");
  EXPECT_EQ(checkpoints_folder("runs/demo"), "runs/demo/checkpoints");
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
  save_steps(manager, {100, 200});
  const std::string manifest = dir / "ckpt/step_00000200/manifest.yaml";
  write_file(manifest, read_file(manifest) + "step: 999\n");
  EXPECT_TRUE(
      contains_all(error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000200"); }),
                   {manifest, "key 'step' is given twice in the same map"}));
  const auto latest = manager.latest_valid();
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->step, 100);
}

TEST(Checkpoint, DamagedCheckpointsAreSkippedWithTheReason) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 10, 0);
  save_steps(manager, {100, 200, 300, 400});
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

// Only the step_<N>.tmp folders begin() makes are removed; a user's folder or
// file ending in .tmp, a name with other digits, and a link (and what it points to) stay.
TEST(Checkpoint, RemoveTemporariesRemovesOnlyXlmesOwnTemporaryFolders) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 3, 0);
  write_parts(manager.begin(200), 200);
  write_parts(manager.begin(123456789), 1);  // nine digits: path_for's name of a large step
  write_file(dir / "ckpt/mine.tmp/notes.txt", "mine");
  write_file(dir / "ckpt/step_1.tmp/notes.txt", "not xlme's name");
  write_file(dir / "ckpt/step_000000300.tmp/notes.txt", "nine digits, a leading zero");
  write_file(dir / "ckpt/step_00000400.tmp", "a file, not a folder");
  write_file(dir / "elsewhere/notes.txt", "linked");
  fs::create_directory_symlink(dir / "elsewhere", dir / "ckpt/step_00000500.tmp");
  manager.remove_temporaries();
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_00000200.tmp"));
  EXPECT_FALSE(fs::exists(dir / "ckpt/step_123456789.tmp"));
  EXPECT_EQ(read_file(dir / "ckpt/mine.tmp/notes.txt"), "mine");
  EXPECT_EQ(read_file(dir / "ckpt/step_1.tmp/notes.txt"), "not xlme's name");
  EXPECT_EQ(read_file(dir / "ckpt/step_000000300.tmp/notes.txt"), "nine digits, a leading zero");
  EXPECT_EQ(read_file(dir / "ckpt/step_00000400.tmp"), "a file, not a folder");
  EXPECT_TRUE(fs::is_symlink(dir / "ckpt/step_00000500.tmp"));
  EXPECT_EQ(read_file(dir / "elsewhere/notes.txt"), "linked");
}

// A manifest entry that is not a plain file name inside the folder is refused
// naming the manifest and the entry, before any file is opened: the sentinel outside, listed with
// its true size and CRC (so that it would verify), and model.bin inside are never opened.
TEST(Checkpoint, ManifestEntriesOutsideTheFolderAreRefusedBeforeAnyFileIsOpened) {
  TempDir dir;
  const CheckpointManager manager(dir / "run/ckpt", 3, 0);
  const std::string path = manager.save(100, [](const std::string& f) { write_parts(f, 100); });
  write_file(dir / "copy-of-model.bin", read_file(path + "/model.bin"));
  write_file(path + "/a/b", "inside, but not a plain name");
  const std::string manifest = path + "/manifest.yaml";
  const std::string secret = "sentinel: keep out\n";
  write_file(dir / "copy-of-sentinel", secret);
  // "upward" and "absolute" stand for the two names of each case's own sentinel (a Sentinel is
  // checked once: its check reads the file).
  const std::vector<std::string> names = {"upward", "absolute", "a/b", ".", "..", ""};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const Sentinel outside(dir / ("sentinel-" + std::to_string(i)), secret);
    std::string name = names[i];
    if (name == "upward") name = fs::relative(outside.path(), path).string();
    if (name == "absolute") name = outside.path();
    SCOPED_TRACE(name);
    const std::string listed = name == "a/b" ? path + "/a/b" : dir / "copy-of-sentinel";
    resign_manifest(path, {{"model.bin", dir / "copy-of-model.bin"},
                           {"rank0.state", path + "/rank0.state"},
                           {name, listed}});
    fs::remove(path + "/model.bin");
    const Sentinel inside(path + "/model.bin", read_file(dir / "copy-of-model.bin"));
    EXPECT_TRUE(contains_all(error_message([&] { CheckpointManager::verify(path); }),
                             {manifest, "lists the file \"" + name + "\"",
                              "not a plain file name inside the checkpoint folder"}));
    EXPECT_TRUE(inside.untouched());
    EXPECT_TRUE(outside.untouched());
    if (i == 0) {
      EXPECT_EQ(name, "../../../sentinel-0");
    }
  }
  EXPECT_FALSE(manager.latest_valid().has_value());
}

// A listed file that is a symbolic link (to a file outside, with its true size
// and CRC) is refused without following it.
TEST(Checkpoint, ALinkInTheCheckpointIsRefusedWithoutFollowingIt) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 3, 0);
  const std::string path = manager.save(100, [](const std::string& f) { write_parts(f, 100); });
  const std::string secret = "sentinel: keep out\n";
  write_file(dir / "copy-of-sentinel", secret);
  const Sentinel outside(dir / "sentinel", secret);
  fs::remove(path + "/model.bin");
  fs::create_symlink(outside.path(), path + "/model.bin");
  resign_manifest(
      path, {{"model.bin", dir / "copy-of-sentinel"}, {"rank0.state", path + "/rank0.state"}});
  EXPECT_TRUE(contains_all(error_message([&] { CheckpointManager::verify(path); }),
                           {path, "model.bin is a symbolic link, not a file"}));
  EXPECT_TRUE(outside.untouched());
}

// A loader gets the path of a file only when the manifest lists it (and verify()
// checked it); an unlisted file is an error naming the manifest and the file.
TEST(Checkpoint, AFileTheManifestDoesNotListIsNotHandedToTheLoader) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 3, 0);
  const std::string path = manager.save(100, [](const std::string& f) { write_parts(f, 100); });
  EXPECT_EQ(CheckpointManager::verify(path).path("model.bin"), path + "/model.bin");
  resign_manifest(path, checkpoint_entries(path, {"model.bin"}));
  const VerifiedFiles files = CheckpointManager::verify(path);
  EXPECT_EQ(files.path("rank0.state"), path + "/rank0.state");
  EXPECT_TRUE(contains_all(error_message([&] { files.path("model.bin"); }),
                           {path + "/manifest.yaml", "does not list model.bin"}));
}

// A module archive with `weight` [250, 4] and `bias` [4], written as a checkpoint's model.pt is.
void write_module_archive(const std::string& path) {
  torch::serialize::OutputArchive archive;
  archive.write("weight", torch::arange(1000, torch::kFloat).reshape({250, 4}));
  archive.write("bias", torch::ones({4}));
  save_archive(archive, path);
}

TEST(Checkpoint, ArchiveReadBackHoldsTheTensorsWritten) {
  TempDir dir;
  write_module_archive(dir / "model.pt");
  const auto tensors = read_module_archive(dir / "model.pt", uint64_t{1} << 20);
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_TRUE(tensors.at("weight").equal(torch::arange(1000, torch::kFloat).reshape({250, 4})));
  EXPECT_TRUE(tensors.at("bias").equal(torch::ones({4})));
}

// A data record shorter than its tensor (the archive re-zipped with the record cut
// to half) is an error naming the file and the tensor, not a read past the record's end.
TEST(Checkpoint, ArchiveRecordShorterThanItsTensorIsRefusedNamingTheTensor) {
  TempDir dir;
  write_module_archive(dir / "model.pt");
  auto records = archive_records(dir / "model.pt");
  int cut = 0;
  for (auto& [name, bytes] : records) {
    if (name.rfind("data/", 0) == 0 && bytes.size() == 4000) {  // weight's 1000 floats
      bytes.resize(2000);
      ++cut;
    }
  }
  ASSERT_EQ(cut, 1);
  write_archive_records(dir / "model.pt", records);
  for (const auto& read : std::vector<std::function<void()>>{
           [&] { read_module_archive(dir / "model.pt", uint64_t{1} << 20); },
           [&] {
             torch::serialize::InputArchive archive;
             load_archive(archive, dir / "model.pt", torch::kCPU, 1 << 20);
           }}) {
    EXPECT_TRUE(contains_all(error_message(read), {dir / "model.pt", "tensor \"weight\"",
                                                   "holds 2000 bytes", "needs 4000", "damaged"}));
  }
}

// An archive that is not a readable zip is an error naming the file.
TEST(Checkpoint, UnreadableArchiveIsNamed) {
  TempDir dir;
  write_module_archive(dir / "model.pt");
  const std::string bytes = read_file(dir / "model.pt");
  write_file(dir / "model.pt", bytes.substr(0, bytes.size() / 2));
  EXPECT_TRUE(
      contains_all(error_message([&] { read_module_archive(dir / "model.pt", uint64_t{1} << 20); }),
                   {"cannot read '" + dir / "model.pt" + "'", "PytorchStreamReader", "damaged"}));
}

// What a module with `weight` [250, 4] and `bias` [4] (write_module_archive's) holds.
WeightSpecs module_specs() {
  return {{"weight", {{250, 4}, torch::kFloat32}}, {"bias", {{4}, torch::kFloat32}}};
}

TEST(Checkpoint, ModuleArchivesMustHoldExactlyTheModelsTensors) {
  TempDir dir;
  const std::string path = dir / "model.pt";
  write_module_archive(path);
  EXPECT_EQ(read_module_archive(path, module_specs()).size(), 2u);

  // An extra tensor (a gate in an ungated run's checkpoint) is named; so are a float64, an int64
  // or a transposed table, which LibTorch's module load took as they were (a resume then failed
  // with "index out of range in self", naming nothing).
  const auto refused = [&](const std::function<void(torch::serialize::OutputArchive&)>& write) {
    torch::serialize::OutputArchive archive;
    write(archive);
    save_archive(archive, path);
    return error_message([&] { read_module_archive(path, module_specs()); });
  };
  const auto weight = torch::arange(1000, torch::kFloat).reshape({250, 4});
  EXPECT_TRUE(contains_all(refused([&](auto& a) {
                             a.write("weight", weight);
                             a.write("bias", torch::ones({4}));
                             a.write("gate_u", torch::ones({2, 2}));
                           }),
                           {"'" + path +
                            "' has 1 weight(s) that the model of its config does not "
                            "have: gate_u"}));
  EXPECT_TRUE(contains_all(refused([&](auto& a) {
                             a.write("weight", weight.to(torch::kFloat64));
                             a.write("bias", torch::ones({4}, torch::kInt64));
                           }),
                           {"'" + path + "' has weights whose dtype differs",
                            "bias (Long stored, Float expected), weight (Double stored, Float "
                            "expected)"}));
  EXPECT_TRUE(contains_all(refused([&](auto& a) {
                             a.write("weight", weight.t().contiguous());
                             a.write("bias", torch::ones({4}));
                           }),
                           {"'" + path + "' has weights whose shape differs",
                            "weight ([4, 250] stored, [250, 4] expected)"}));
  EXPECT_TRUE(contains_all(refused([&](auto& a) { a.write("weight", weight); }),
                           {"'" + path +
                            "' lacks 1 weight(s) that the model of its config needs: "
                            "bias"}));
}

TEST(Checkpoint, AnArchiveLargerThanItsModelIsRefusedUnread) {
  // A record declared as 1 GiB on a sparse file: neither the file nor the record is read.
  TempDir dir;
  const std::string path = dir / "model.pt";
  write_module_archive(path);
  auto records = archive_records(path);
  records["data/99"] = std::string(16, '\0');
  write_archive_records(path, records);
  fs::resize_file(path, fs::file_size(path) + (uint64_t{1} << 30));
  EXPECT_TRUE(contains_all(error_message([&] { read_module_archive(path, module_specs()); }),
                           {"'" + path + "' is 10",
                            "bytes, more than twice the 4016 bytes of tensor "
                            "data this reader expects of it",
                            "not read"}));
  // Within the file's bound, an unused data record is counted against the tensors' bytes.
  write_module_archive(path);
  records = archive_records(path);
  records["data/99"] = std::string(4096, '\0');
  write_archive_records(path, records);
  EXPECT_TRUE(
      contains_all(error_message([&] { read_module_archive(path, module_specs()); }),
                   {"'" + path + "' declares 8112 bytes of tensor data", "more than the 4016"}));
}

TEST(Checkpoint, ACheckpointOfANewerFormatIsNamedNotSkippedAsDamaged) {
  TempDir dir;
  const CheckpointManager manager(dir / "ckpt", 10, 0);
  save_steps(manager, {100, 200});
  const std::string manifest = dir / "ckpt/step_00000200/manifest.yaml";
  std::string text = read_file(manifest);
  text.replace(text.find("version: 1"), 10, "version: 99");
  write_file(manifest, text);
  const std::string said =
      "checkpoint '" + dir / "ckpt/step_00000200" +
      "' was written by a newer xlme (checkpoint format version 99; this build reads version "
      "1); it is not damaged. Upgrade xlme to read it, or point to an older checkpoint";
  // Resuming from step 100 instead would silently lose the newer checkpoint's steps.
  EXPECT_TRUE(contains_all(error_message([&] { manager.latest_valid(); }), {said}));
  EXPECT_TRUE(contains_all(
      error_message([&] { CheckpointManager::verify(dir / "ckpt/step_00000200"); }), {said}));
  EXPECT_EQ(CheckpointManager::verify(dir / "ckpt/step_00000100").folder(),
            dir / "ckpt/step_00000100");
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
}  // namespace xlme::checkpoint
