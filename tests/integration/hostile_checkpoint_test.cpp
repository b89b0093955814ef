// Checkpoints altered by someone else, against the release xlme-pretrain: each case copies one real
// checkpoint, alters it and re-signs its manifest (so that it verifies), runs --resume or
// --init-from on it, and checks the exit code (never a signal), that the message names the file and
// the entry, tensor or key, and that nothing outside was opened.
#include "fault_fixtures.h"
#include "hostile_fixtures.h"
#include "test_util.h"
#include "xlme/checkpoint/archive.h"
#include "xlme/config/config.h"
#include "xlme/model/electra.h"

#include <torch/serialize.h>

#include <functional>
#include <iostream>
#include <regex>

namespace xlme {
namespace {

namespace fs = std::filesystem;
using testing::archive_records;
using testing::checkpoint_entries;
using testing::fails_cleanly;
using testing::HostileRun;
using testing::read_file;
using testing::resign_manifest;
using testing::run_hostile;
using testing::Sentinel;
using testing::TempDir;
using testing::tiny_pretrain_args;
using testing::write_archive_records;
using testing::write_file;

class HostileCheckpoint : public ::testing::Test {
 protected:
  // One checkpoint of the tiny model (step 1), made by xlme-pretrain once for the suite.
  static void SetUpTestSuite() {
    setup_.run([] {
      made_ = new TempDir();
      const HostileRun r = run_hostile("xlme-pretrain", tiny_pretrain_args(*made_ / "run", 1));
      if (r.code != 0) throw std::runtime_error("xlme-pretrain failed:\n" + r.err);
    });
  }
  static void TearDownTestSuite() { delete made_; }
  inline static TempDir* made_ = nullptr;
  inline static testing::SuiteSetUp setup_;

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(setup_.check());
    fresh_copy();
  }

  // The checkpoint copied afresh to given/step_00000001 (the altered one).
  void fresh_copy() {
    fs::remove_all(dir_ / "given");
    fs::create_directories(dir_ / "given");
    fs::copy(*made_ / "run/checkpoints/step_00000001", checkpoint_);
  }

  // xlme-pretrain resuming from the altered checkpoint in a fresh run folder.
  HostileRun resume() const {
    fs::remove_all(dir_ / "run");
    return logged(run_hostile("xlme-pretrain",
                              tiny_pretrain_args(dir_ / "run", 2, {"--resume", checkpoint_})));
  }
  // xlme-pretrain starting a fresh run from the altered checkpoint's weights.
  HostileRun init_from() const {
    fs::remove_all(dir_ / "run");
    return logged(run_hostile("xlme-pretrain",
                              tiny_pretrain_args(dir_ / "run", 1, {"--init-from", checkpoint_})));
  }
  // xlme-export of the altered checkpoint into a fresh folder.
  HostileRun export_it() const {
    fs::remove_all(dir_ / "export");
    return logged(
        run_hostile("xlme-export", {"--checkpoint", checkpoint_, "--out", dir_ / "export"}));
  }
  // Prints the case's exit code and error line (the issue's table of cases).
  static HostileRun logged(const HostileRun& r) {
    std::smatch line;
    const std::string err = r.err;
    const bool found = std::regex_search(err, line, std::regex(R"(\] error: ([^\n]*))"));
    std::cout << "case: " << ::testing::UnitTest::GetInstance()->current_test_info()->name()
              << " | exit " << r.code << " signal " << r.signal << " | "
              << (found ? line[1].str() : "(no error line)") << "\n";
    return r;
  }

  const TempDir dir_;
  const std::string checkpoint_ = dir_ / "given/step_00000001";
  const std::string manifest_ = checkpoint_ + "/manifest.yaml";
};

// Item 3(a): a manifest entry that leads out of the checkpoint folder (upward or absolute), listed
// with the true size and CRC of the sentinel it names (so that it would verify), is refused naming
// the manifest and the entry, and the sentinel is never opened.
TEST_F(HostileCheckpoint, ManifestEntryOutsideTheFolderIsRefusedAndNeverOpened) {
  const std::string secret = "sentinel: keep out\n";
  write_file(dir_ / "copy-of-sentinel", secret);
  for (const bool upward : {true, false}) {
    const Sentinel sentinel(dir_ / (upward ? "sentinel-upward" : "sentinel-absolute"), secret);
    const std::string name =
        upward ? fs::relative(sentinel.path(), checkpoint_).string() : sentinel.path();
    SCOPED_TRACE(name);
    auto entries = checkpoint_entries(checkpoint_);
    entries.push_back({name, dir_ / "copy-of-sentinel"});
    resign_manifest(checkpoint_, entries);
    for (const HostileRun& r : {resume(), init_from()}) {
      EXPECT_TRUE(fails_cleanly(r, 1, {manifest_, "\"" + name + "\"", "not a plain file name"}));
    }
    EXPECT_TRUE(sentinel.untouched());  // checked once: the check reads the file
  }
}

// Item 6: a manifest that leaves out a file the loader reads (so that it could be replaced at
// will) is refused naming the manifest and the file, by --resume and (model.pt) --init-from.
TEST_F(HostileCheckpoint, ManifestThatOmitsAFileTheLoaderReadsIsRefused) {
  for (const std::string name :
       {"model.pt", "optimizer.pt", "rank0.pt", "trainer.yaml", "config.yaml"}) {
    SCOPED_TRACE(name);
    fresh_copy();
    resign_manifest(checkpoint_, checkpoint_entries(checkpoint_, {name}));
    EXPECT_TRUE(fails_cleanly(resume(), 1, {manifest_, "does not list " + name}));
    if (name == "model.pt") {
      EXPECT_TRUE(fails_cleanly(init_from(), 1, {manifest_, "does not list model.pt"}));
    }
    if (name == "model.pt" || name == "trainer.yaml" || name == "config.yaml") {
      EXPECT_TRUE(fails_cleanly(export_it(), 1, {manifest_, "does not list " + name}));
    }
  }
}

// Item 6: a data record cut to half of its tensor (the archive re-zipped, the manifest re-signed)
// is refused naming the file and the tensor, instead of being read past its end.
TEST_F(HostileCheckpoint, RecordShorterThanItsTensorIsRefusedNamingFileAndTensor) {
  for (const std::string name : {"model.pt", "optimizer.pt"}) {
    SCOPED_TRACE(name);
    fresh_copy();
    const std::string file = checkpoint_ + "/" + name;
    auto records = archive_records(file);
    std::string* largest = nullptr;
    for (auto& [record, bytes] : records) {
      if (record.rfind("data/", 0) == 0 && (!largest || bytes.size() > largest->size())) {
        largest = &bytes;
      }
    }
    ASSERT_NE(largest, nullptr);
    const std::size_t full = largest->size();
    largest->resize(full / 2);
    write_archive_records(file, records);
    resign_manifest(checkpoint_, checkpoint_entries(checkpoint_));
    std::vector<HostileRun> runs = {resume()};
    if (name == "model.pt") runs.push_back(init_from());
    for (const HostileRun& r : runs) {
      EXPECT_TRUE(
          fails_cleanly(r, 1,
                        {"'" + file + "'", "the data record of tensor \"",
                         fmt::format("holds {} bytes but its storage needs {}", full / 2, full)}));
    }
  }
}

// NaN/inf weights (a diverged run) are not exported, fine-tuned, evaluated or resumed from: every
// reader of the weights refuses them naming the file and the tensor.
TEST_F(HostileCheckpoint, NonFiniteWeightsAreRefusedNamingFileAndTensor) {
  const std::string file = checkpoint_ + "/model.pt";
  auto records = archive_records(file);
  std::string* largest = nullptr;  // the token table: float32, whose 0xff bytes are NaN
  for (auto& [record, bytes] : records) {
    if (record.rfind("data/", 0) == 0 && (!largest || bytes.size() > largest->size())) {
      largest = &bytes;
    }
  }
  ASSERT_NE(largest, nullptr);
  std::fill(largest->begin(), largest->end(), '\xff');
  write_archive_records(file, records);
  resign_manifest(checkpoint_, checkpoint_entries(checkpoint_));
  for (const HostileRun& r : {resume(), init_from(), export_it()}) {
    EXPECT_TRUE(fails_cleanly(
        r, 1,
        {"'" + file + "': tensor '", "NaN or infinite values of", "use an earlier checkpoint"}));
  }
}

// The checkpoint's model.pt rewritten after `edit` of the model it holds (the run's own model,
// built from its config.yaml), its manifest re-signed.
void edit_model(const std::string& checkpoint,
                const std::function<void(model::ElectraModel&)>& edit) {
  const config::Config run = config::load_config(checkpoint + "/config.yaml");
  model::ElectraModel model(run.model, model::architecture_for(run.objectives.set),
                            data::SpecialIds::for_vocab(run.model.vocab_size));
  torch::serialize::InputArchive in;
  in.load_from(checkpoint + "/model.pt");
  model->load(in);
  edit(model);
  torch::serialize::OutputArchive out;
  model->save(out);
  checkpoint::save_archive(out, checkpoint + "/model.pt");
  testing::resign_manifest(checkpoint, testing::checkpoint_entries(checkpoint));
}

// An extra gate tensor in an ungated run's checkpoint resumed without a word; a float64 or a
// transposed table failed with "index out of range in self", naming nothing.
TEST_F(HostileCheckpoint, ExtraMistypedOrTransposedTensorsAreRefusedNamingThem) {
  const std::string file = checkpoint_ + "/model.pt";
  torch::NoGradGuard no_grad;
  edit_model(checkpoint_, [](model::ElectraModel& m) {
    m->discriminator->register_parameter("gate_extra", torch::ones({4, 8}));
  });
  for (const HostileRun& r : {resume(), export_it()}) {
    EXPECT_TRUE(fails_cleanly(r, 1,
                              {"'" + file +
                               "' has 1 weight(s) that the model of its config does "
                               "not have: discriminator.gate_extra"}));
  }
  fresh_copy();
  edit_model(checkpoint_, [](model::ElectraModel& m) {
    auto table = m->named_parameters()["embeddings.token.weight"];
    table.set_data(table.to(torch::kFloat64));
  });
  for (const HostileRun& r : {resume(), export_it()}) {
    EXPECT_TRUE(fails_cleanly(r, 1,
                              {"'" + file + "' has weights whose dtype differs",
                               "embeddings.token.weight (Double stored, Float expected)"}));
  }
  fresh_copy();
  std::string shape;
  edit_model(checkpoint_, [&](model::ElectraModel& m) {
    auto table = m->named_parameters()["embeddings.token.weight"];
    table.set_data(table.t().contiguous());
    shape = fmt::format("[{}, {}] stored, [{}, {}] expected", table.size(0), table.size(1),
                        table.size(1), table.size(0));
  });
  for (const HostileRun& r : {resume(), export_it()}) {
    EXPECT_TRUE(fails_cleanly(r, 1,
                              {"'" + file + "' has weights whose shape differs",
                               "embeddings.token.weight (" + shape + ")"}));
  }
}

// Item 6: trainer.yaml values out of range or of the wrong type are refused naming the file and
// the key.
TEST_F(HostileCheckpoint, TrainerStateOutOfRangeIsRefusedNamingFileAndKey) {
  const std::string file = checkpoint_ + "/trainer.yaml";
  const std::string saved = read_file(file);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"step", "9223372036854775807"},
      {"step", "-1"},
      {"step", "[1]"},
      {"world_size", "0"},
      {"world_size", "-2"},
      {"tokens_seen", "-5"},
      {"skipped_steps", "2"},  // more than the checkpoint's 1 step
  };
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key + ": " + value);
    write_file(file, std::regex_replace(saved, std::regex(key + ": [^\n]*"), key + ": " + value));
    ASSERT_NE(read_file(file), saved);
    resign_manifest(checkpoint_, checkpoint_entries(checkpoint_));
    EXPECT_TRUE(fails_cleanly(resume(), 1, {file, "field '" + key + "'"}));
    EXPECT_TRUE(fails_cleanly(export_it(), 1, {file, "field '" + key + "'"}));
  }
}

// Item 9: model.pt, optimizer.pt or rank0.pt cut to half (no longer a readable zip) with the
// manifest re-signed is an error naming the file and saying it is damaged.
TEST_F(HostileCheckpoint, UnreadableArchiveIsNamed) {
  for (const std::string name : {"model.pt", "optimizer.pt", "rank0.pt"}) {
    SCOPED_TRACE(name);
    fresh_copy();
    const std::string file = checkpoint_ + "/" + name;
    const std::string bytes = read_file(file);
    write_file(file, bytes.substr(0, bytes.size() / 2));
    resign_manifest(checkpoint_, checkpoint_entries(checkpoint_));
    EXPECT_TRUE(fails_cleanly(resume(), 1, {"cannot read '" + file + "'", "damaged"}));
  }
}

}  // namespace
}  // namespace xlme
