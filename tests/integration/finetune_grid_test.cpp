// scripts/finetune_grid.sh end to end: every `# grid:` line of a config is one xlme-finetune run
// in its own folder, the dev score of each is the one its results.json records, and the best is
// kept; bad grids and failing points are reported with the file and the point.
#include "export_fixtures.h"
#include "test_util.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

namespace xlme::finetune {
namespace {

using xlme::testing::contains_all;
using xlme::testing::quote;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

// XNLI rows with a learnable rule: the hypothesis's last word names the label.
std::string grid_xnli_rows(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  auto word = [&] {
    std::string w;
    for (unsigned n = 3 + rng() % 4; n > 0; --n) w += static_cast<char>('a' + rng() % 26);
    return w;
  };
  const char* cue[] = {"zzno", "zzyes", "zzmaybe"};
  const char* label[] = {"contradiction", "entailment", "neutral"};
  std::string out;
  for (size_t i = 0; i < count; ++i) {
    out += word() + " " + word() + " " + word() + "\t" + word() + " " + cue[i % 3] + "\t" +
           label[i % 3] + "\n";
  }
  return out;
}

struct GridRun {
  int code = -1;
  std::string output;
};

class FinetuneGrid : public xlme::testing::TinyCheckpointSuite<FinetuneGrid> {
 protected:
  void SetUp() override {
    TinyCheckpointSuite::SetUp();
    write_file((data_.path() / "download/xnli/train-en.tsv").string(), grid_xnli_rows(60, 1));
    write_file((data_.path() / "download/xnli/dev-en.tsv").string(), grid_xnli_rows(30, 2));
    write_file((data_.path() / "download/xnli/test-en.tsv").string(), grid_xnli_rows(30, 3));
  }

  // A config with `grid_lines` above an XNLI recipe on the fixtures.
  std::string config_with(const std::string& grid_lines) {
    const auto path = (data_.path() / "grid.yaml").string();
    write_file(path, grid_lines + "finetune:\n  task: xnli\n  init: " + checkpoint() +
                         "\n  data_dir: " + (data_.path() / "download").string() +
                         "\n  languages: [en]\n  max_len: 64\n  dropout: 0\n  epochs: 25\n"
                         "  batch_size: 8\n  eval_every: 30\nrun:\n  device: cpu\n");
    return path;
  }

  GridRun run_grid(const std::string& config) {
    const auto log = (data_.path() / "grid.log").string();
    const std::string command =
        "XLME_FINETUNE=" + quote(std::string(XLME_BINARY_DIR) + "/xlme-finetune") + " bash " +
        quote(std::string(XLME_SOURCE_DIR) + "/scripts/finetune_grid.sh") + " " + quote(config) +
        " " + quote((data_.path() / "out").string()) + " >" + quote(log) + " 2>&1";
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(log)};
  }

  TempDir data_;
};

TEST_F(FinetuneGrid, RunsEveryPointInItsFolderAndKeepsTheBestDev) {
  // A learning rate that learns nothing, then one that learns the rule (two seeds: the score is
  // their mean).
  const auto config =
      config_with("# grid: finetune.lr=1.0e-9\n# grid: finetune.lr=2.0e-3 finetune.seeds=[1,2]\n");
  const auto run = run_grid(config);
  ASSERT_EQ(run.code, 0) << run.output;
  const auto grid = nlohmann::json::parse(read_file(data_.path() / "out/grid.json"));
  ASSERT_EQ(grid["points"].size(), 2u) << grid.dump(2);
  EXPECT_EQ(grid["task"], "xnli");
  EXPECT_EQ(grid["dev_metric"], "accuracy");
  std::vector<double> devs;
  for (size_t i = 0; i < 2; ++i) {
    const auto folder = data_.path() / ("out/point" + std::to_string(i + 1));
    const auto results = nlohmann::json::parse(read_file(folder / "results.json"));
    // Each point ran with its own overrides on top of the config.
    const auto yaml = results["config"].get<std::string>();
    EXPECT_TRUE(contains_all(yaml, {i == 0 ? "lr: 1e-09" : "lr: 0.002", "epochs: 25"})) << yaml;
    double sum = 0;
    for (const auto& s : results["selection"]) sum += s["dev"].get<double>();
    devs.push_back(sum / static_cast<double>(results["selection"].size()));
    EXPECT_EQ(results["selection"].size(), i == 0 ? 1u : 2u);
    EXPECT_DOUBLE_EQ(grid["points"][i]["dev"].get<double>(), devs.back());
    EXPECT_EQ(grid["points"][i]["dir"], folder.string());
  }
  EXPECT_EQ(grid["points"][1]["point"], "finetune.lr=2.0e-3 finetune.seeds=[1,2]");
  // The rule is learnt at 2e-3 and not at 1e-9 (chance is 33); the best is that point.
  EXPECT_LT(devs[0], 50.0);
  EXPECT_GT(devs[1], 60.0);
  EXPECT_EQ(grid["best"]["point"], grid["points"][1]["point"]);
  EXPECT_DOUBLE_EQ(grid["best"]["dev"].get<double>(), devs[1]);
  EXPECT_TRUE(
      contains_all(run.output, {"best: finetune.lr=2.0e-3 finetune.seeds=[1,2]", "grid.json"}))
      << run.output;
}

TEST_F(FinetuneGrid, BadGridsAndFailingPointsNameTheFileAndThePoint) {
  const auto none = config_with("# a comment, no grid\n");
  auto run = run_grid(none);
  EXPECT_EQ(run.code, 1);
  EXPECT_TRUE(contains_all(run.output, {none, "has no '# grid:' lines"})) << run.output;

  const auto malformed = config_with("# grid: finetune.lr=1e-3 epochs\n");
  run = run_grid(malformed);
  EXPECT_EQ(run.code, 1);
  EXPECT_TRUE(contains_all(run.output, {malformed, "grid point 1", "'epochs' is not key=value"}))
      << run.output;

  // xlme-finetune rejects the value; the script names the point that failed and stops there.
  const auto failing = config_with("# grid: finetune.lr=fast\n# grid: finetune.lr=1e-3\n");
  run = run_grid(failing);
  EXPECT_EQ(run.code, 1);
  EXPECT_TRUE(contains_all(run.output, {"finetune.lr", "point 1 (finetune.lr=fast) failed"}))
      << run.output;
  EXPECT_FALSE(std::filesystem::exists(data_.path() / "out/point2"));
  EXPECT_FALSE(std::filesystem::exists(data_.path() / "out/grid.json"));
}

}  // namespace
}  // namespace xlme::finetune
