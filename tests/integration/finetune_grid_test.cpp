// scripts/finetune_grid.sh end to end: every `# grid:` line of a config is one xlme-finetune run
// in its own folder, the dev score of each is the one its results.json records, and the best is
// kept; bad grids and failing points are reported with the file and the point.
#include "xlme/config/config.h"

#include "export_fixtures.h"
#include "test_util.h"

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

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

// TyDiQA-GoldP has no dev set in XTREME; its grid runs as XTREME's scripts run it (final
// weights, no selection): every point is run and listed with its test average, none is selected.
TEST_F(FinetuneGrid, TaskWithoutDevSetRunsEveryPointAndSelectsNone) {
  nlohmann::json train = {{"data", nlohmann::json::array()}};
  nlohmann::json paragraphs = nlohmann::json::array();
  for (int i = 0; i < 6; ++i) {
    const std::string before = "abc def ghi zzans ", answer = "word" + std::to_string(i);
    nlohmann::json answers = nlohmann::json::array();
    answers.push_back({{"text", answer}, {"answer_start", before.size()}});
    nlohmann::json question = {
        {"id", "q" + std::to_string(i)}, {"question", "what follows"}, {"answers", answers}};
    nlohmann::json qas = nlohmann::json::array();
    qas.push_back(question);
    paragraphs.push_back({{"context", before + answer + " jkl"}, {"qas", qas}});
  }
  train["data"].push_back({{"paragraphs", paragraphs}});
  const auto download = data_.path() / "download/tydiqa";
  write_file((download / "tydiqa-goldp-v1.1-train/tydiqa.goldp.en.train.json").string(),
             train.dump());
  write_file((download / "tydiqa-goldp-v1.1-dev/tydiqa.goldp.en.dev.json").string(), train.dump());
  const auto path = (data_.path() / "tydiqa.yaml").string();
  write_file(path,
             "# grid: finetune.lr=2.0e-5 finetune.epochs=1\n# grid: finetune.lr=3.0e-5\n"
             "finetune:\n  task: tydiqa\n  init: " +
                 checkpoint() + "\n  data_dir: " + (data_.path() / "download").string() +
                 "\n  languages: [en]\n  max_len: 64\n  doc_stride: 16\n  max_query_len: "
                 "16\n  max_steps: 1\n  select: last\nrun:\n  device: cpu\n");
  const auto run = run_grid(path);
  ASSERT_EQ(run.code, 0) << run.output;
  const auto grid = nlohmann::json::parse(read_file(data_.path() / "out/grid.json"));
  ASSERT_EQ(grid["points"].size(), 2u) << grid.dump(2);
  EXPECT_TRUE(grid["best"].is_null()) << grid.dump(2);
  EXPECT_TRUE(grid["points"][1]["dev"].is_null());
  EXPECT_TRUE(grid["points"][1]["test_average"].is_number()) << grid.dump(2);
  EXPECT_TRUE(contains_all(grid["selection"].get<std::string>(),
                           {"tydiqa has no en dev set", "final weights", "no point is selected"}));
  EXPECT_TRUE(contains_all(run.output, {"no point selected", "test average"})) << run.output;
}

// A stand-in for xlme-finetune that writes the results.json of a point: dev 50 at lr 1e-5, 60
// otherwise; a test average over 2 of 4 languages; the en dev set cut when the point sets
// finetune.max_eval_examples. The grid's reading of results.json is tested without training.
const char* kFakeFinetune = R"(#!/usr/bin/env bash
out=; lr=; cut=
for a in "$@"; do
  case $a in
    run.out_dir=*) out=${a#*=} ;;
    finetune.lr=*) lr=${a#*=} ;;
    finetune.max_eval_examples=*) cut=${a#*=} ;;
  esac
done
dev=60; [[ $lr == 1e-5 ]] && dev=50
subset=
[[ -n $cut ]] && subset=", \"subset\": {\"max_eval_examples\": $cut, \"languages\": {\"en\":
  {\"scored\": $cut, \"of\": 2077, \"unit\": \"sentence\"}}}"
mkdir -p "$out"
cat >"$out/results.json" <<JSON
{"task": "udpos", "train_language": "en", "selection": [{"seed": 1, "dev": $dev}],
 "dev": {"main": "f1", "average": {"mean": $dev, "covers": ["en"], "lacks": [], "of": 1},
         "languages": {"en": {}} $subset},
 "test": {"main": "f1", "average": {"mean": 40.5, "covers": ["de", "en"], "lacks": ["af", "ar"],
          "of": 4}, "languages": {}}}
JSON
)";

GridRun run_fake_grid(const TempDir& dir, const std::string& grid_lines) {
  const auto fake = (dir.path() / "fake-finetune").string();
  write_file(fake, kFakeFinetune);
  std::filesystem::permissions(fake, std::filesystem::perms::owner_all);
  const auto config = (dir.path() / "grid.yaml").string();
  write_file(config, grid_lines + "finetune:\n  task: udpos\n");
  const auto log = (dir.path() / "grid.log").string();
  std::filesystem::remove_all(dir.path() / "out");
  const std::string command = "XLME_FINETUNE=" + quote(fake) + " bash " +
                              quote(std::string(XLME_SOURCE_DIR) + "/scripts/finetune_grid.sh") +
                              " " + quote(config) + " " + quote((dir.path() / "out").string()) +
                              " >" + quote(log) + " 2>&1";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(log)};
}

// The grid shows what each test average covers, flags scores of sets cut by
// finetune.max_eval_examples, and refuses to compare subset scores with full-set ones.
TEST(FinetuneGridResults, ShowCoverageAndFlagSubsets) {
  TempDir dir;
  auto run = run_fake_grid(dir, "# grid: finetune.lr=1e-5\n# grid: finetune.lr=2e-5\n");
  ASSERT_EQ(run.code, 0) << run.output;
  auto grid = nlohmann::json::parse(read_file(dir.path() / "out/grid.json"));
  EXPECT_EQ(grid["points"][0]["test_covers"], nlohmann::json::parse(R"(["de", "en"])"));
  EXPECT_EQ(grid["points"][0]["test_lacks"], nlohmann::json::parse(R"(["af", "ar"])"));
  EXPECT_TRUE(grid["points"][0]["subset"].is_null()) << grid.dump(2);
  EXPECT_TRUE(contains_all(run.output, {"* dev 60.0000  finetune.lr=2e-5",
                                        "test average 40.5000 over 2 of 4 languages)"}))
      << run.output;
  EXPECT_EQ(run.output.find("subset"), std::string::npos) << run.output;

  run = run_fake_grid(dir,
                      "# grid: finetune.lr=1e-5 finetune.max_eval_examples=300\n"
                      "# grid: finetune.lr=2e-5 finetune.max_eval_examples=300\n");
  ASSERT_EQ(run.code, 0) << run.output;
  grid = nlohmann::json::parse(read_file(dir.path() / "out/grid.json"));
  EXPECT_EQ(grid["points"][1]["subset"],
            nlohmann::json::parse(R"(["dev en 300 of 2077 sentences"])"))
      << grid.dump(2);
  EXPECT_TRUE(contains_all(run.output, {"* dev 60.0000 [subset]  finetune.lr=2e-5",
                                        "every score is on subsets (finetune.max_eval_examples: "
                                        "dev en 300 of 2077 sentences)"}))
      << run.output;

  run = run_fake_grid(dir,
                      "# grid: finetune.lr=1e-5 finetune.max_eval_examples=300\n"
                      "# grid: finetune.lr=2e-5\n");
  EXPECT_EQ(run.code, 1) << run.output;
  EXPECT_TRUE(
      contains_all(run.output, {(dir.path() / "out/point1/results.json").string(), "scores subsets",
                                (dir.path() / "out/point2/results.json").string(), "full sets",
                                "run every point with the same finetune.max_eval_examples"}))
      << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "out/grid.json"));
}

// The values of the XLM-E paper's Table 11 (../shared/PAPER.md), one row per trained task: batch
// sizes, learning rates, epochs (a set is a grid), and the warm-up (a ratio, or steps).
struct Table11Row {
  std::string task;
  std::set<int64_t> batch_sizes;
  std::set<double> lrs;
  std::set<int64_t> epochs;
  double warmup_ratio;
  int64_t warmup_steps;
};

// configs/finetune/paper/ holds the recipe of every task of Table 11; every `# grid:`
// point is accepted by the config loader (what scripts/finetune_grid.sh passes to xlme-finetune)
// and the points together are the table's grid.
TEST(FinetunePaperRecipes, EveryTaskOfTable11WithItsGrid) {
  const std::vector<Table11Row> table = {
      {"udpos", {8, 16, 32}, {1e-5, 2e-5, 3e-5}, {10}, 0.1, 0},
      {"panx", {8}, {5e-6, 6e-6, 7e-6, 8e-6, 9e-6}, {10}, 0.1, 0},
      {"xquad", {32}, {2e-5, 3e-5, 4e-5}, {4}, 0.1, 0},
      {"mlqa", {32}, {2e-5, 3e-5, 4e-5}, {2, 3, 4}, 0.1, 0},
      {"tydiqa", {32}, {2e-5, 3e-5, 4e-5}, {10, 20, 40}, 0.1, 0},
      {"xnli", {32}, {5e-6, 6e-6, 7e-6, 8e-6}, {10}, 0.0, 12500},
      {"pawsx", {32}, {8e-6, 9e-6, 10e-6, 20e-6}, {10}, 0.1, 0},
  };
  for (const auto& row : table) {
    SCOPED_TRACE(row.task);
    const std::string path =
        std::string(XLME_SOURCE_DIR) + "/configs/finetune/paper/" + row.task + ".yaml";
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    std::vector<std::vector<std::string>> points = {{}};  // the file itself is the first point
    std::istringstream lines(read_file(path));
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("# grid:", 0) != 0) continue;
      std::istringstream words(line.substr(7));
      std::vector<std::string> sets;
      for (std::string w; words >> w;) sets.push_back(w);
      points.push_back(sets);
    }
    const size_t grid = row.batch_sizes.size() * row.lrs.size() * row.epochs.size();
    EXPECT_EQ(points.size(), grid > 1 ? grid + 1 : 2u) << "# grid: lines of " << path;
    std::set<std::tuple<int64_t, double, int64_t>> seen;
    for (const auto& sets : points) {
      const auto c = config::load_config(path, sets).finetune;
      EXPECT_EQ(c.task, row.task);
      EXPECT_TRUE(row.batch_sizes.count(c.batch_size)) << c.batch_size;
      EXPECT_TRUE(std::any_of(row.lrs.begin(), row.lrs.end(), [&](double lr) {
        return std::abs(lr - c.lr) < 1e-12;
      })) << c.lr;
      EXPECT_TRUE(row.epochs.count(c.epochs)) << c.epochs;
      EXPECT_EQ(c.weight_decay, 0.0);
      EXPECT_EQ(c.warmup_steps, row.warmup_steps);
      if (row.warmup_steps == 0) {
        EXPECT_DOUBLE_EQ(c.warmup_ratio, row.warmup_ratio);
      }
      if (!sets.empty()) seen.insert({c.batch_size, std::round(c.lr * 1e7), c.epochs});
    }
    EXPECT_EQ(seen.size(), grid) << "the grid points are the table's grid";
  }
}

}  // namespace
}  // namespace xlme::finetune
