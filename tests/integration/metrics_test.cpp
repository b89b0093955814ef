// Metrics JSON lines, read back by Python's json module through scripts/plot_metrics.py, which
// must turn them into PNG files.
#include "xlme/train/metrics.h"
#include "xlme/common/json.h"

#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

namespace xlme::train {
namespace {

using xlme::testing::contains_all;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

TEST(Metrics, RecordsAreOrderedJsonWithNullForNonFinite) {
  MetricsRecord record;
  record.add("step", int64_t{10})
      .add("kind", std::string("train"))
      .add("loss/mlm", 7.25)
      .add("lr", 5e-4)
      .add("bad", std::numeric_limits<double>::quiet_NaN())
      .add("note", std::string("a \"quoted\"\tline\n"));
  EXPECT_EQ(
      record.to_json(),
      "{\"step\": 10, \"kind\": \"train\", \"loss/mlm\": 7.25, \"lr\": 0.0005, \"bad\": null, "
      "\"note\": \"a \\\"quoted\\\"\\tline\\n\"}");
  EXPECT_EQ(xlme::json_quote(std::string("\x01", 1)), "\"\\u0001\"");
}

int run_shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The generator's and the discriminator's losses on panels of their own (their scales differ
// ~15x), training and validation told apart, the retrieval pairs as one faint legend entry, and
// summary.png holding every panel.
TEST(Metrics, PlotScriptDrawsASummaryWithPanelsOnTheirOwnScales) {
  TempDir dir;
  {
    MetricsWriter writer(dir / "run/metrics.jsonl");
    for (int64_t step = 10; step <= 100; step += 10) {
      MetricsRecord train;
      train.add("step", step).add("kind", std::string("train")).add("lr", 1e-3 / step);
      train.add("loss/mlm", 9.0 / std::sqrt(step)).add("loss/mrtd", 0.7 - step * 1e-3);
      train.add("f1/mrtd", 0.2 + step * 1e-3).add("grad_norm", 1.0 + 1.0 / step);
      writer.write(train);
    }
    MetricsRecord valid;
    valid.add("step", int64_t{100}).add("kind", std::string("validation")).add("loss/mlm", 1.5);
    valid.add("loss/mrtd", 0.5).add("retrieval/mean", 0.05);
    for (const char* pair : {"en-de", "en-fr", "en-ja"}) {
      valid.add(std::string("retrieval/") + pair + "/a_to_b", 0.04)
          .add(std::string("retrieval/") + pair + "/b_to_a", 0.06);
    }
    writer.write(valid);
  }
  EXPECT_EQ(read_file(dir / "run/metrics.jsonl").find("{\"step\": 10, \"kind\": \"train\""), 0u);
  const std::string script = std::string(XLME_SOURCE_DIR) + "/scripts/plot_metrics.py";
  ASSERT_EQ(run_shell(std::string(XLME_PYTHON) + " " + script + " " + (dir / "run") +
                      " --describe > " + (dir / "out.txt") + " 2>&1"),
            0)
      << read_file(dir / "out.txt");
  const std::string out = read_file(dir / "out.txt");
  EXPECT_EQ(out.find(dir / "run/plots/summary.png\n"), 0u) << out;
  EXPECT_TRUE(contains_all(
      out, {"generator loss (cross-entropy): mlm train, mlm validation\n",
            "discriminator loss (binary cross-entropy): mrtd train, mrtd validation\n",
            "discriminator replaced-token F1 (F1): mrtd train\n",
            "retrieval on held-out pairs (validation) (accuracy@1): each pair and direction (6), "
            "mean\n",
            "learning rate and gradient norm (learning rate; right axis gradient norm): learning "
            "rate, gradient norm (right)\n"}))
      << out;
  EXPECT_EQ(out.find("throughput"), std::string::npos) << "no throughput was recorded: " << out;
  for (const char* name :
       {"summary.png", "generator.png", "discriminator.png", "retrieval.png", "optimization.png"}) {
    EXPECT_TRUE(contains_all(out, {dir / ("run/plots/" + std::string(name))})) << name;
    const std::string png = read_file(dir / ("run/plots/" + std::string(name)));
    ASSERT_GT(png.size(), 1000u) << name;
    EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n") << name;
  }
}

TEST(Metrics, PlotScriptNamesTheBadLine) {
  TempDir dir;
  write_file(dir / "run/metrics.jsonl", "{\"step\": 1, \"lr\": 0.1}\n{\"step\": 2, \"lr\"\n");
  const std::string script = std::string(XLME_SOURCE_DIR) + "/scripts/plot_metrics.py";
  EXPECT_NE(run_shell(std::string(XLME_PYTHON) + " " + script + " " + (dir / "run") + " > " +
                      (dir / "out.txt") + " 2>&1"),
            0);
  EXPECT_TRUE(
      contains_all(read_file(dir / "out.txt"), {dir / "run/metrics.jsonl:2: not a JSON object"}));
  EXPECT_NE(run_shell(std::string(XLME_PYTHON) + " " + script + " " + (dir / "nothing") + " > " +
                      (dir / "out.txt") + " 2>&1"),
            0);
  EXPECT_TRUE(contains_all(read_file(dir / "out.txt"), {"metrics.jsonl not found"}));
}

}  // namespace
}  // namespace xlme::train
