// Hostile exports: a real export of a tiny model, then its
// config.json or model.safetensors crafted to break readers (deep JSON, sizes out of range,
// overflowing shapes, tensors sharing bytes), and --out folders that hold the input or are
// symbolic links. Every case runs the release binaries or scripts/xlme_reference.py and asserts
// the exit code (never a signal), the file and the key or tensor named, and that nothing the user
// had was lost or touched.
#include "xlme/checkpoint/export_folder.h"
#include "xlme/checkpoint/safetensors.h"
#include "xlme/common/io.h"
#include "xlme/export/export.h"

#include "export_fixtures.h"
#include "fault_fixtures.h"
#include "hostile_fixtures.h"
#include "memory_fixtures.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <functional>

namespace xlme::export_ {
namespace {

namespace fs = std::filesystem;
using checkpoint::kExportConfigFile;
using xlme::FileLock;
using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::fails_cleanly;
using xlme::testing::HostileRun;
using xlme::testing::nested_json_array;
using xlme::testing::quote;
using xlme::testing::read_file;
using xlme::testing::run_hostile;
using xlme::testing::Sentinel;
using xlme::testing::shell;
using xlme::testing::TempDir;
using xlme::testing::write_file;
using xlme::testing::write_raw_safetensors;

// Address space for each binary (ulimit -v): a tiny model's run fits well inside, an allocation
// sized by a hostile config does not, and fails inside the test instead of taking the machine.
constexpr int64_t kHostileExportLimitKiB = 6 * 1024 * 1024;

const char* const kHostileReferencePython = XLME_PYTHON;

class HostileExport : public xlme::testing::TinyCheckpointSuite<HostileExport> {
 public:
  static constexpr double kPerturb = 0.1;
  // The suite's checkpoint exported to suite_dir()/export.
  static void prepare() {
    step_ = "checkpoints/" + fs::path(checkpoint()).filename().string();
    ExportOptions options;
    options.checkpoint = checkpoint();
    options.out_dir = suite_dir() / "export";
    export_model(options);
  }

 protected:
  inline static std::string step_;  // the checkpoint in the run folder: checkpoints/step_<N>

  // A copy of the suite's run folder (its checkpoint step_, metrics) at `to`.
  static void copy_run(const std::string& to) {
    fs::copy(suite_dir() / "run", to, fs::copy_options::recursive);
  }

  // A copy of the suite's export at `to`, with the JSON text `value` put in config.json under the
  // dotted `key` ("heads", "generator.heads"); no edit when `key` is empty.
  static std::string export_copy(const std::string& to, const std::string& key = "",
                                 const std::string& value = "") {
    fs::copy(suite_dir() / "export", to, fs::copy_options::recursive);
    if (key.empty()) return to;
    const std::string path = to + "/" + kExportConfigFile;
    auto config = nlohmann::ordered_json::parse(read_file(path));
    nlohmann::ordered_json* at = &config;
    for (size_t start = 0;;) {
      const size_t dot = key.find('.', start);
      at = &(*at)[key.substr(start, dot - start)];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    *at = "@VALUE@";
    std::string text = config.dump(2);
    text.replace(text.find("\"@VALUE@\""), 9, value);
    write_file(path, text);
    return to;
  }

  // xlme-export reading the export `folder` (the loader xlme-finetune uses too), writing beside it.
  static HostileRun export_from(const std::string& folder) {
    return run_hostile("xlme-export", {"--checkpoint", folder, "--out", folder + "-again"}, "",
                       kHostileExportLimitKiB);
  }

  // xlme-finetune initialized from `folder`.
  static HostileRun finetune_from(const std::string& folder, const std::string& run_dir) {
    return run_hostile(
        "xlme-finetune",
        {"--config", "configs/finetune/xnli.yaml", "--set", "finetune.init=" + folder, "--set",
         "run.out_dir=" + run_dir, "--set", "run.device=cpu"},
        "", kHostileExportLimitKiB);
  }

  // scripts/xlme_reference.py on the export `folder`, with `args` after --model.
  static HostileRun reference(const std::string& folder, const std::vector<std::string>& args) {
    const TempDir scratch;
    std::string command = "cd " + quote(XLME_SOURCE_DIR) + " && " + kHostileReferencePython +
                          " scripts/xlme_reference.py --model " + quote(folder);
    for (const auto& a : args) command += " " + quote(a);
    command += " >" + quote(scratch / "out") + " 2>" + quote(scratch / "err");
    const int status = std::system(command.c_str());
    HostileRun r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    r.out = read_file(scratch / "out");
    r.err = read_file(scratch / "err");
    return r;
  }
};

TEST_F(HostileExport, TheUneditedExportLoadsWithinTheMemoryLimit) {
  // The control for every case below: the same folder, not edited, exports again.
  TempDir dir;
  const auto run = export_from(export_copy(dir / "e"));
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.signal, 0);
}

TEST_F(HostileExport, DeepJsonInConfigJsonIsRefusedNamingTheFile) {
  // 100000 levels under "heads": the old reader dump()ed the value into "wrong type" (SIGSEGV).
  TempDir dir;
  const auto folder = export_copy(dir / "e", "heads", nested_json_array(100000));
  const auto run = finetune_from(folder, dir / "run");
  EXPECT_TRUE(fails_cleanly(
      run, 1,
      {"export config '" + folder + "/config.json' is nested too deeply", "more than 64 levels"}));
}

TEST_F(HostileExport, DeepJsonInTheSafetensorsHeaderIsRefusedNamingTheFile) {
  TempDir dir;
  const auto folder = export_copy(dir / "e");
  write_raw_safetensors(
      folder + "/model.safetensors",
      R"({"w":{"dtype":)" + nested_json_array(100000) + R"(,"shape":[1],"data_offsets":[0,4]}})",
      "xxxx");
  const auto run = finetune_from(folder, dir / "run");
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {"safetensors file '" + folder +
                             "/model.safetensors': the header is nested "
                             "too deeply"}));
}

TEST_F(HostileExport, ConfigValuesOutOfRangeAreRefusedNamingFileAndKey) {
  struct Case {
    std::string key, value, message;
  };
  // The old reader: heads 0 -> SIGFPE; negative sizes -> "internal error: negative dimension";
  // layer_norm_eps -1 and dropout 1.5 -> loaded (NaN or garbage downstream); 4.5 -> 4.
  const std::vector<Case> cases = {
      {"heads", "0", "heads is 0; it must be an integer in [1, 1024]"},
      {"heads", "3", "hidden_size (32, in export config"},
      {"heads", "4.5", "'heads' must be a 64-bit integer, got a number 4.5"},
      {"heads", "\"4\"", "'heads' must be a 64-bit integer, got a string \"4\""},
      {"hidden_size", "-32", "hidden_size is -32; it must be an integer in [1, 65536]"},
      {"ffn_size", "-1", "ffn_size is -1; it must be an integer in [1, 1048576]"},
      {"max_positions", "-5", "max_positions is -5; it must be an integer in [1, 1048576]"},
      {"embedding_size", "64", "embedding_size (64, in export config"},
      {"layer_norm_eps", "-1", "layer_norm_eps is -1.0; it must be a number in (0.0, 1.0)"},
      {"dropout", "1.5", "dropout is 1.5; it must be a number in [0.0, 1.0)"},
      {"relative_position.num_buckets", "33", "relative_position.num_buckets (33, in export"},
      {"generator.heads", "-4", "generator.heads is -4; it must be an integer in [0, 1024]"},
      {"norm", "\"sideways\"", "norm is 'sideways'; it must be one of: post, pre"},
      {"vocab_size", "0", "vocab_size is 0; it must be at least 1"},
      {"special_ids.mask", "100000", "special_ids.mask is 100000; it must be an id of the"},
      {"layers", "18446744073709551615",
       "'layers' must be a 64-bit integer, got an integer 18446744073709551615"},
  };
  TempDir dir;
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + ": " + c.value);
    const auto folder = export_copy(dir / ("e" + std::to_string(n++)), c.key, c.value);
    const auto run = export_from(folder);
    EXPECT_TRUE(fails_cleanly(run, 1, {folder + "/config.json", c.message}));
    EXPECT_FALSE(fs::exists(folder + "-again"));
  }
}

// model.safetensors of the export `folder` with one more tensor, `name`, declared as `bytes` of
// F32 past the end of the data; the file is extended without writing (a sparse file of a few
// hundred kilobytes on disk).
void add_declared_tensor(const std::string& folder, const std::string& name, uint64_t bytes) {
  xlme::testing::declare_unwritten_tensor(folder + "/model.safetensors", name,
                                          static_cast<int64_t>(bytes / 4));
}

TEST_F(HostileExport, AnExtraTensorDeclaredAs8GiBIsRefusedByNameUnread) {
  // The old readers allocated what the file declared: past 6 GB for xlme-finetune and the
  // reference loader, and 2 GiB made xlme-export do the same. The bound docs/export.md states:
  // a hostile export costs no more memory than the honest one (within 256 MiB).
  TempDir dir;
  const auto control = export_from(export_copy(dir / "control"));
  ASSERT_EQ(control.code, 0) << control.err;
  const int64_t honest = xlme::testing::peak_rss_mib(RUSAGE_CHILDREN);
  const auto folder = export_copy(dir / "e");
  add_declared_tensor(folder, "extra.weight", uint64_t{8} << 30);
  const std::string named = "'" + folder +
                            "/model.safetensors' has 1 weight(s) that the model of its config "
                            "does not have: extra.weight";
  EXPECT_TRUE(fails_cleanly(export_from(folder), 1, {named}));
  EXPECT_TRUE(fails_cleanly(finetune_from(folder, dir / "ft"), 1, {named}));
  EXPECT_LT(xlme::testing::peak_rss_mib(RUSAGE_CHILDREN), honest + 256)
      << "the 8 GiB tensor was read";
  const std::string lacks = xlme::testing::python_lacks(kHostileReferencePython, "torch");
  ASSERT_TRUE(lacks.empty()) << lacks;
  const auto run = reference(folder, {"--ids", "0 5 6 7 2"});
  EXPECT_EQ(run.code, 1) << run.err;
  EXPECT_TRUE(contains_all(run.err, {folder + "/model.safetensors", "tensor 'extra.weight'",
                                     "is not a weight of the model", "it is not read"}))
      << run.err;
  EXPECT_LT(xlme::testing::peak_rss_mib(RUSAGE_CHILDREN), honest + 256)
      << "the reference loader read the tensor";
}

TEST_F(HostileExport, TheReferenceLoaderRefusesNonFiniteAndMistypedWeightsNamingThem) {
  // It printed NaN hidden states from NaN weights, which the C++ readers refuse.
  const std::string lacks = xlme::testing::python_lacks(kHostileReferencePython, "torch");
  ASSERT_TRUE(lacks.empty()) << lacks;
  TempDir dir;
  const auto folder = export_copy(dir / "e");
  const std::string weights = folder + "/model.safetensors";
  auto content = checkpoint::read_safetensors(weights);
  const auto original = content;
  content.tensors["embeddings.token.weight"][3][1] = std::nan("");
  checkpoint::write_safetensors(weights, content);
  auto run = reference(folder, {"--ids", "0 5 6 7 2"});
  EXPECT_EQ(run.code, 1) << run.out;
  EXPECT_TRUE(contains_all(run.err, {weights,
                                     "tensor 'embeddings.token.weight' holds 1 "
                                     "NaN or infinite values"}))
      << run.err;
  content = original;
  content.tensors["embeddings.token.weight"] =
      content.tensors["embeddings.token.weight"].to(torch::kFloat64);
  checkpoint::write_safetensors(weights, content);
  run = reference(folder, {"--ids", "0 5 6 7 2"});
  EXPECT_EQ(run.code, 1) << run.out;
  EXPECT_TRUE(contains_all(run.err, {weights, "tensor 'embeddings.token.weight' is F64",
                                     "says dtype float32 (F32); no conversion applies"}))
      << run.err;
}

TEST_F(HostileExport, ABillionLayersFailWithinTheMemoryLimit) {
  // The old reader built 1e9 layers: 7.2 GB and rising before bad_alloc.
  TempDir dir;
  const auto folder = export_copy(dir / "e", "layers", "1e9");
  const auto run = export_from(folder);
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {folder + "/config.json",
                             "layers is 1000000000; it must be an integer "
                             "in [1, 1024]"}));
}

TEST_F(HostileExport, AnInRangeConfigLargerThanTheWeightsIsRefusedBeforeBuildingIt) {
  // Every size at its limit: a model of about 10^14 parameters, refused before any allocation.
  TempDir dir;
  auto folder = export_copy(dir / "e", "layers", "1024");
  auto config = nlohmann::ordered_json::parse(read_file(folder + "/config.json"));
  config["hidden_size"] = 65536;
  config["heads"] = 1024;
  config["ffn_size"] = 1048576;
  write_file(folder + "/config.json", config.dump(2));
  const auto run = export_from(folder);
  EXPECT_TRUE(
      fails_cleanly(run, 1,
                    {"'" + folder + "/config.json' describes a model with",
                     "'" + folder + "/model.safetensors' holds only", "do not belong together"}));
}

TEST_F(HostileExport, ShapesWhoseSizeOverflowsAreRefusedNamingFileAndTensor) {
  // 2^40 x 2^40 floats: the byte count wrapped to 0, matched data_offsets [0, 0], and LibTorch
  // failed with "Storage size calculation overflowed" and a backtrace.
  TempDir dir;
  const auto folder = export_copy(dir / "e");
  write_raw_safetensors(
      folder + "/model.safetensors",
      R"({"embeddings.token.weight":{"dtype":"F32","shape":[1099511627776,1099511627776],)"
      R"("data_offsets":[0,0]}})",
      "");
  const auto run = export_from(folder);
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {"safetensors file '" + folder + "/model.safetensors'",
                             "tensor 'embeddings.token.weight'", "(its size overflows)"}));
  EXPECT_EQ(run.err.find("Storage size"), std::string::npos) << run.err;
}

TEST_F(HostileExport, ForceNeverRemovesTheRunOrAFolderHoldingIt) {
  TempDir dir;
  copy_run(dir / "run");
  const std::string checkpoint = dir / ("run/" + step_);
  const auto before = xlme::testing::snapshot(dir.path().string());
  for (const std::string& out : {dir / "run", dir / "run/checkpoints", dir.path().string(),
                                 dir / ("run/" + step_), dir / "run/../run/"}) {
    SCOPED_TRACE(out);
    const auto run =
        run_hostile("xlme-export", {"--checkpoint", checkpoint, "--out", out, "--force"});
    EXPECT_TRUE(fails_cleanly(run, 1,
                              {"--out '" + out +
                                   "' is the folder being exported or "
                                   "holds it",
                               checkpoint}));
    EXPECT_TRUE(xlme::testing::nothing_lost(before));
  }
  // The same through a symbolic link to the run's parent.
  fs::create_directory_symlink(dir.path(), dir / "link");
  const auto run = run_hostile("xlme-export", {"--checkpoint", dir / ("link/run/" + step_), "--out",
                                               dir / "link/run", "--force"});
  EXPECT_TRUE(fails_cleanly(run, 1, {"is the folder being exported or holds it"}));
  EXPECT_TRUE(xlme::testing::nothing_lost(before));
}

TEST_F(HostileExport, ForceNeverReplacesASymbolicLinkOrWhatItPointsTo) {
  // The rule: --out must be the real folder; a link there is refused whatever it points to (a
  // user's folder, or even an export xlme wrote), and neither the link nor its target changes.
  TempDir dir;
  copy_run(dir / "run");
  write_file(dir / "mine/notes.txt", "the user's notes\n");
  fs::create_directory_symlink(dir / "mine", dir / "link");
  export_copy(dir / "exported");
  fs::create_directory_symlink(dir / "exported", dir / "link-to-export");
  const auto before = xlme::testing::snapshot(dir.path().string());
  const Sentinel sentinel(dir / "mine/keep.txt");  // after the snapshot, which reads every file
  for (const std::string& link : {dir / "link", dir / "link-to-export", dir / "link-to-export/"}) {
    SCOPED_TRACE(link);
    const auto run = run_hostile(
        "xlme-export", {"--checkpoint", dir / ("run/" + step_), "--out", link, "--force"});
    EXPECT_TRUE(fails_cleanly(run, 1,
                              {"export folder '" + link + "' is a symbolic link",
                               "never writes or replaces through one"}));
    EXPECT_TRUE(fs::is_symlink(dir / "link"));
    EXPECT_TRUE(fs::is_symlink(dir / "link-to-export"));
  }
  EXPECT_TRUE(xlme::testing::nothing_lost(before));
  EXPECT_TRUE(sentinel.untouched());
}

// Two exports to one --out at once must not both exit 0 with one export silently gone. An export
// holds <out>.lock: the second fails at once naming the first (here this test).
TEST_F(HostileExport, TwoExportsToOneFolderAtOnceTheSecondFailsNamingTheFirst) {
  TempDir dir;
  const std::string out = dir / "exported";
  const FileLock first(out + ".lock", "the test's export");
  const auto run = run_hostile("xlme-export", {"--checkpoint", checkpoint(), "--out", out});
  EXPECT_TRUE(fails_cleanly(
      run, 1,
      {"export folder '" + out + "' is in use by another process (pid " +
           std::to_string(::getpid()),
       "two exports to one --out would replace each other", "choose another folder"}));
  EXPECT_FALSE(fs::exists(out));
}

// The --force and marker checks do not run at start only, so that the final rename cannot remove
// whatever is at --out by then (a run folder moved there during a long export). The folder at
// --out is checked again when the export moves into place: anything but an empty
// folder or (with --force) an export is kept as it is, and the new export discarded.
TEST_F(HostileExport, WhatAppearsAtOutWhileTheExportRunsIsKept) {
  TempDir dir;
  const std::string out = dir / "exported";
  const auto written = [&] { return export_copy(dir / "written"); };
  // A run folder (checkpoints, results) moved to --out meanwhile, with and without --force.
  copy_run(out);
  write_file(out + "/results.json", "{\"accuracy\": 76.6}\n");
  const auto before = xlme::testing::snapshot(out);
  for (const bool force : {true, false}) {
    const std::string message =
        error_message([&] { move_export_into_place(written(), out, force); });
    EXPECT_TRUE(contains_all(message, {"export folder '" + out + "' changed while the export ran",
                                       force ? "it holds checkpoints" : "it is not empty",
                                       "left as it is and the new export discarded"}))
        << message;
    EXPECT_TRUE(xlme::testing::nothing_lost(before));
    EXPECT_FALSE(fs::exists(dir / "written"));
  }
  // A user's folder without the marker, and a symbolic link.
  fs::remove_all(out);
  write_file(out + "/notes.txt", "mine\n");
  EXPECT_TRUE(contains_all(error_message([&] { move_export_into_place(written(), out, true); }),
                           {"no .xlme-export marker file"}));
  EXPECT_EQ(read_file(out + "/notes.txt"), "mine\n");
  fs::rename(out, dir / "mine");
  fs::create_directory_symlink(dir / "mine", out);
  EXPECT_TRUE(contains_all(error_message([&] { move_export_into_place(written(), out, true); }),
                           {"it is now a symbolic link"}));
  EXPECT_EQ(read_file(dir / "mine/notes.txt"), "mine\n");
  // An export there (another run of xlme-export) is replaced with --force; nothing is left aside.
  fs::remove(out);
  export_copy(out);
  move_export_into_place(written(), out, true);
  EXPECT_TRUE(fs::is_regular_file(out + "/.xlme-export"));
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".old-"), std::string::npos) << entry.path();
  }
}

// Killed exports left <out>.tmp-<pid> folders forever (845 MB after 8 kills). The next export of
// the same --out removes an unfinished one: marked as such by the export that wrote it and holding
// only export files. It keeps (with a warning) one that holds anything else, and a user's folder
// of export-like files at such a name without the marker (it was deleted by its name alone).
TEST_F(HostileExport, UnfinishedFoldersOfKilledExportsAreRemovedByTheNext) {
  TempDir dir;
  const std::string out = dir / "exported";
  write_file(out + ".tmp-999991/model.safetensors", std::string(1 << 20, 'x'));
  write_file(out + ".tmp-999991/.xlme-export-unfinished", "an unfinished xlme-export\n");
  write_file(out + ".tmp-999992/notes.txt", "mine\n");
  // Killed while writing its weights: the half-written file is the export's own.
  write_file(out + ".tmp-999993/model.safetensors.tmp-999993", std::string(1 << 20, 'x'));
  write_file(out + ".tmp-999993/.xlme-export-unfinished", "an unfinished xlme-export\n");
  write_file(out + ".tmp-download/config.json", "{}\n");
  write_file(out + ".tmp-download/model.safetensors", "user's weights");
  const auto run = run_hostile("xlme-export", {"--checkpoint", checkpoint(), "--out", out});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_TRUE(contains_all(run.err, {"removed '" + out +
                                         ".tmp-999991', the unfinished folder of "
                                         "an xlme-export that was killed",
                                     "'" + out +
                                         ".tmp-999992' looks like a folder a killed "
                                         "xlme-export left, but holds other files; it is kept"}))
      << run.err;
  EXPECT_FALSE(fs::exists(out + ".tmp-999991"));
  EXPECT_FALSE(fs::exists(out + ".tmp-999993"));
  EXPECT_EQ(read_file(out + ".tmp-999992/notes.txt"), "mine\n");
  EXPECT_EQ(read_file(out + ".tmp-download/model.safetensors"), "user's weights");
  EXPECT_TRUE(contains_all(run.err, {"'" + out + ".tmp-download' looks like a folder"})) << run.err;
  EXPECT_FALSE(fs::exists(out + "/.xlme-export-unfinished"));
  EXPECT_TRUE(fs::is_regular_file(out + "/.xlme-export"));
  EXPECT_FALSE(fs::exists(out + ".lock"));  // the export's lock goes with it
}

// --checkpoint takes a run folder and exports its newest valid checkpoint,
// through the resolver finetune.init uses; a damaged newer one is skipped with a warning (the
// newest by name, as `ls | sort | tail` gives it, may not be valid).
TEST_F(HostileExport, ARunFolderExportsItsNewestValidCheckpoint) {
  TempDir dir;
  copy_run(dir / "run");
  const std::string valid = dir / ("run/" + step_);
  const std::string damaged = dir / "run/checkpoints/step_99999999";
  fs::copy(valid, damaged, fs::copy_options::recursive);
  xlme::testing::flip_manifest_byte(damaged);
  const auto run = run_hostile("xlme-export", {"--checkpoint", dir / "run", "--out", dir / "out"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_TRUE(contains_all(run.err, {"run folder " + (dir / "run") +
                                     ": exporting its newest valid checkpoint " + valid}))
      << run.err;
  const auto exported = nlohmann::json::parse(read_file(dir / "out/config.json"));
  const auto original = nlohmann::json::parse(read_file(suite_dir() / "export/config.json"));
  EXPECT_EQ(exported["training"]["step"], original["training"]["step"]);
  EXPECT_TRUE(exported["training"]["step"].is_number_integer());
}

TEST_F(HostileExport, ForceRemovesAnExportButNotWhatItsLinksPointTo) {
  // An export folder xlme wrote, with a link among its own names (__pycache__) to a user's
  // folder: --force replaces the export and removes the link, never the files behind it.
  TempDir dir;
  copy_run(dir / "run");
  const auto folder = export_copy(dir / "exported");
  write_file(dir / "mine/notes.txt", "the user's notes\n");
  fs::create_directory_symlink(dir / "mine", folder + "/__pycache__");
  const auto before = xlme::testing::snapshot(dir / "mine");
  const Sentinel sentinel(dir / "mine/keep.txt");  // after the snapshot, which reads every file
  const auto run = run_hostile(
      "xlme-export", {"--checkpoint", dir / ("run/" + step_), "--out", folder, "--force"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_FALSE(fs::exists(folder + "/__pycache__"));
  EXPECT_TRUE(fs::is_regular_file(folder + "/.xlme-export"));
  EXPECT_TRUE(xlme::testing::nothing_lost(before));
  EXPECT_TRUE(sentinel.untouched());
}

// A safetensors header that lists a tensor name twice (each reader would keep one copy, maybe not
// the same) is refused naming the file and the name (the reference
// loader's case is in TheReferenceLoaderChecksHeadersLikeTheCppReader).
TEST_F(HostileExport, DuplicateTensorNamesAreRefusedNamingFileAndName) {
  TempDir dir;
  const auto folder = export_copy(dir / "e");
  const std::string ids = R"("input_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[0,16]})";
  write_raw_safetensors(folder + "/model.safetensors", "{" + ids + "," + ids + "}",
                        std::string(16, '\0'));
  EXPECT_TRUE(fails_cleanly(export_from(folder), 1,
                            {"safetensors file '" + folder +
                                 "/model.safetensors': the header lists the key \"input_ids\" "
                                 "twice",
                             "made to break readers"}));
}

TEST_F(HostileExport, TheReferenceLoaderChecksHeadersLikeTheCppReader) {
  const std::string lacks = xlme::testing::python_lacks(kHostileReferencePython, "torch");
  ASSERT_TRUE(lacks.empty()) << lacks;
  TempDir dir;
  const auto folder = export_copy(dir / "e");
  // The control: the unedited export and a well-formed input file run.
  const std::string ids = R"("input_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[0,16]})";
  const std::string two_ids = std::string("\0\0\0\0\0\0\0\0\2\0\0\0\0\0\0\0", 16);
  write_raw_safetensors(dir / "good.safetensors", "{" + ids + "}", two_ids);
  auto run = reference(folder, {"--inputs", dir / "good.safetensors"});
  ASSERT_EQ(run.code, 0) << run.err;

  struct Case {
    std::string name, header, data, message;
  };
  // The old loader: negative offsets and shared regions loaded with exit 0 (wrong values); the
  // others ended in KeyError, UnicodeDecodeError, RecursionError or numpy tracebacks.
  const std::vector<Case> cases = {
      {"negative offset", R"({"input_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[-8,8]}})",
       two_ids,
       "tensor 'input_ids': data_offsets must be [begin, end] with 0 <= begin <= end, got list "
       "[-8, 8]"},
      {"shared region",
       "{" + ids + R"(,"positions":{"dtype":"I64","shape":[1,2],"data_offsets":[0,16]}})", two_ids,
       "tensors 'input_ids' and 'positions' overlap"},
      {"gap", R"({"input_ids":{"dtype":"I64","shape":[1,2],"data_offsets":[8,24]}})",
       two_ids + two_ids, "bytes [0, 8) of the data belong to no tensor (before 'input_ids')"},
      {"unknown dtype", R"({"input_ids":{"dtype":"Q7","shape":[1,2],"data_offsets":[0,16]}})",
       two_ids, "tensor 'input_ids' has the unknown dtype str 'Q7'"},
      {"span", R"({"input_ids":{"dtype":"I64","shape":[1,3],"data_offsets":[0,16]}})", two_ids,
       "tensor 'input_ids' (I64 of shape [1, 3]) needs 24 bytes but its data_offsets [0, 16] "
       "span 16"},
      {"overflow",
       R"({"input_ids":{"dtype":"F32","shape":[1099511627776,1099511627776],)"
       R"("data_offsets":[0,0]}})",
       "",
       "tensor 'input_ids' (F32 of shape [1099511627776, 1099511627776]) would need more "
       "than 2^63 bytes"},
      {"no dtype", R"({"input_ids":{"shape":[1,2],"data_offsets":[0,16]}})", two_ids,
       "tensor 'input_ids' needs an object with dtype, shape and data_offsets"},
      {"deep", R"({"input_ids":)" + nested_json_array(100000) + "}", "",
       "the header is nested too deeply: more than 64 levels"},
      {"not UTF-8", "{\"input_ids\xff\":1}", "", "the header is not UTF-8 text (byte 11 is 0xff)"},
      {"left over", "{" + ids + "}", two_ids + "xxxx",
       "its tensors cover 16 bytes of data but the file holds 20"},
      {"no input_ids", "{}", "", "has no tensor 'input_ids'"},
      {"duplicate name", "{" + ids + "," + ids + "}", two_ids,
       "the header lists the key \"input_ids\" twice"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = dir / "in.safetensors";
    write_raw_safetensors(file, c.header, c.data);
    run = reference(folder, {"--inputs", file});
    EXPECT_TRUE(fails_cleanly(
        run, 1, {"xlme_reference.py: error: safetensors file '" + file + "'", c.message}));
    EXPECT_EQ(run.err.find("Traceback"), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }

  // The export's own files: a deep config.json, heads 0, and weights that lack a tensor.
  const auto deep = export_copy(dir / "deep", "heads", nested_json_array(100000));
  run = reference(deep, {"--ids", "0 2"});
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {"export config '" + deep +
                             "/config.json' is nested too "
                             "deeply"}));
  const auto zero = export_copy(dir / "zero", "heads", "0");
  run = reference(zero, {"--ids", "0 2"});
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {"export config '" + zero +
                             "/config.json': 'heads' must be "
                             "an integer in [1, 1024]"}));
  const auto lacking = export_copy(dir / "lacking");
  write_raw_safetensors(lacking + "/model.safetensors", "{}", "");
  run = reference(lacking, {"--ids", "0 2"});
  EXPECT_TRUE(fails_cleanly(run, 1,
                            {"safetensors file '" + lacking +
                             "/model.safetensors' has "
                             "no tensor 'embeddings."}));
  EXPECT_EQ(run.err.find("Traceback"), std::string::npos) << run.err;
}

// xlme_reference.py does not end in a Python traceback naming no file (RuntimeError from
// view/einsum, IndexError from the bucket table) for a config.json value out of range or not
// fitting the weights, or for token ids outside the vocabulary: each is one line naming the config
// file and the key (or the input), exit 1.
TEST_F(HostileExport, TheReferenceLoaderNamesFileAndKeyForOutOfRangeConfigs) {
  const std::string lacks = xlme::testing::python_lacks(kHostileReferencePython, "torch");
  ASSERT_TRUE(lacks.empty()) << lacks;
  struct Case {
    std::string key, value, message;
  };
  const std::vector<Case> cases = {
      {"vocab_size", "-5", "'vocab_size' must be an integer in [1, 2147483647], got int -5"},
      {"ffn_size", "-1", "'ffn_size' must be an integer in [1, 1048576], got int -1"},
      {"embedding_size", "-1", "'embedding_size' must be an integer in [1, hidden_size (32)]"},
      {"generator.hidden_size", "-3", "'generator.hidden_size' must be an integer in [1, 65536]"},
      {"special_ids.pad", "1000", "'special_ids.pad' must be an id of the vocabulary"},
      {"relative_position.num_buckets", "1024",
       "'relative_position.max_distance' must be an integer in [2, 1048576] above num_buckets / "
       "4 (256)"},
      // In range, but not the weights' shapes (tracebacks from view, einsum and indexing before).
      {"hidden_size", "64", "gives it [64 (hidden_size), 64 (hidden_size)]"},
      {"heads", "8", "[8 (heads), 32 (relative_position.num_buckets)]"},
      {"ffn_size", "64", "gives it [64 (ffn_size), 32 (hidden_size)]"},
      {"relative_position.num_buckets", "34", "[4 (heads), 34 (relative_position.num_buckets)]"},
      {"max_positions", "2", "gives it [2 (max_positions), 32 (embedding_size)]"},
  };
  TempDir dir;
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.key + ": " + c.value);
    const auto folder = export_copy(dir / ("e" + std::to_string(n++)), c.key, c.value);
    const auto run = reference(folder, {"--ids", "0 5 2"});
    EXPECT_TRUE(
        fails_cleanly(run, 1, {"xlme_reference.py: error: ", folder + "/config.json", c.message}));
    EXPECT_EQ(run.err.find("Traceback"), std::string::npos) << run.err;
    EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  }
  // Inputs outside the vocabulary or the positions: named with the input.
  const auto folder = export_copy(dir / "ids");
  std::string long_ids = "0";  // 65 tokens: the tiny model has 64 positions
  for (int i = 1; i < 65; ++i) long_ids += " 5";
  for (const auto& [ids, message] : std::vector<std::pair<std::string, std::string>>{
           {"0 100000 2",
            "--ids: token id 100000 (sequence 0, position 1) is outside the "
            "vocabulary of"},
           {"0 x 2", "--ids takes token ids separated by spaces"},
           {long_ids, "sequences of 65 tokens are longer than the model's max_positions (64"}}) {
    SCOPED_TRACE(ids.substr(0, 20));
    const auto run = reference(folder, {"--ids", ids});
    EXPECT_TRUE(fails_cleanly(run, 1, {"xlme_reference.py: error: ", message}));
    EXPECT_EQ(run.err.find("Traceback"), std::string::npos) << run.err;
  }
}

// An export whose spm.model was swapped for another SentencePiece model of the same size must not
// load silently (ids read as other pieces). config.json records spm.model's size and
// CRC32 (tokenizer_config.json its CRC32): xlme-export/xlme-finetune's loader, xlme_reference.py
// and the transformers tokenizer refuse the swapped file, naming it.
TEST_F(HostileExport, ASwappedTokenizerOfTheSameSizeIsNamedByEveryLoader) {
  TempDir dir;
  const auto folder = export_copy(dir / "e");
  const std::string spm = folder + "/spm.model";
  const auto config = nlohmann::json::parse(read_file(folder + "/config.json"));
  ASSERT_TRUE(config.contains("spm_model")) << config.dump(2);
  EXPECT_EQ(config["spm_model"]["file"], "spm.model");
  EXPECT_EQ(config["spm_model"]["bytes"], fs::file_size(spm));
  // Another model of the same size: one letter of a piece changed (a valid model still).
  std::string bytes = read_file(spm);
  size_t at = 0;  // the first letter of a piece "▁x..."
  while ((at = bytes.find("\xE2\x96\x81", at)) != std::string::npos &&
         !(at + 3 < bytes.size() && bytes[at + 3] >= 'a' && bytes[at + 3] <= 'z')) {
    ++at;
  }
  ASSERT_NE(at, std::string::npos);
  at += 3;
  bytes[at] = bytes[at] == 'q' ? 'z' : 'q';
  write_file(spm, bytes);
  const std::string named = "'" + spm + "' (" + std::to_string(bytes.size()) + " bytes, CRC32 ";
  EXPECT_TRUE(fails_cleanly(export_from(folder), 1,
                            {named, "is not the SentencePiece model this export was made with",
                             "export config '" + folder + "/config.json' records"}));
  EXPECT_TRUE(fails_cleanly(finetune_from(folder, dir / "run"), 1, {named}));
  EXPECT_TRUE(fails_cleanly(reference(folder, {"--ids", "0 5 2"}), 1,
                            {"xlme_reference.py: error: " + named}));
  const auto [code, out] =
      shell(std::string(kHostileReferencePython) + " -c 'import transformers'");
  if (code == 0) {
    const auto hf =
        shell("cd " + quote(dir.path()) + " && HF_HUB_OFFLINE=1 " + kHostileReferencePython +
              " -c 'import transformers; transformers.AutoTokenizer.from_pretrained(" + "\"" +
              folder + "\", trust_remote_code=True)'");
    EXPECT_NE(hf.first, 0);
    EXPECT_TRUE(contains_all(hf.second, {"(CRC32 ",
                                         "is not the SentencePiece model this export "
                                         "was made with (tokenizer_config.json"}))
        << hf.second;
  }
  // The export's own file back: every loader takes it.
  fs::copy_file(suite_dir() / "export/spm.model", spm, fs::copy_options::overwrite_existing);
  EXPECT_TRUE(fails_cleanly(reference(folder, {"--ids", "0 5 2"}), 0, {}));
  EXPECT_TRUE(fails_cleanly(export_from(folder), 0, {}));
}

}  // namespace
}  // namespace xlme::export_
