// Parameter counts: the analytic counts equal the built modules' on small configs, and the
// paper's sizes (XLM-E Table 3) follow from the analytic counts.
#include "xlme/model/parameter_count.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace xlme::model {
namespace {

config::ModelConfig model_config(const std::string& name, int64_t vocab_size) {
  return config::load_config(std::string(XLME_SOURCE_DIR) + "/configs/model/" + name + ".yaml",
                             {"model.vocab_size=" + std::to_string(vocab_size)})
      .model;
}

void expect_counts_match(const config::ModelConfig& m, Architecture a, const std::string& what) {
  torch::manual_seed(0);
  ElectraModel model(m, a);
  const auto built = parameter_counts(*model);
  const auto analytic = analytic_parameter_counts(m, a);
  ASSERT_EQ(built.size(), analytic.size()) << what;
  for (size_t i = 0; i < built.size(); ++i) {
    EXPECT_EQ(built[i].module, analytic[i].module) << what;
    EXPECT_EQ(built[i].count, analytic[i].count) << what << ": " << built[i].module;
  }
}

TEST(ParameterCounts, AnalyticEqualsBuiltModules) {
  const std::vector<std::pair<std::string, std::function<void(config::ModelConfig&)>>> variants = {
      {"default", [](auto&) {}},
      {"gdes", [](auto& m) { m.embedding_sharing = config::EmbeddingSharing::kGdes; }},
      {"pre-LN, shared table",
       [](auto& m) {
         m.norm = config::Norm::kPre;
         m.relative_position.shared_across_layers = true;
       }},
      {"no relative bias, no positions",
       [](auto& m) {
         m.relative_position.enabled = false;
         m.absolute_positions = false;
       }},
      {"plain relative bias, narrow generator",
       [](auto& m) {
         m.relative_position.gated = false;
         m.generator.hidden_size = 32;
         m.generator.heads = 1;
         m.generator.ffn_size = 48;
       }},
  };
  for (const auto& [name, apply] : variants) {
    auto m = model_config("tiny", 300);
    apply(m);
    expect_counts_match(m, Architecture::kElectra, "tiny " + name);
    expect_counts_match(m, Architecture::kMaskedLm, "tiny mlm " + name);
    expect_counts_match(m, Architecture::kEncoder, "tiny distillation student " + name);
  }
  expect_counts_match(model_config("small", 8000), Architecture::kElectra, "small");
  // Base's layers with a small vocabulary (the vocabulary only adds V x E and V).
  expect_counts_match(model_config("base", 1000), Architecture::kElectra, "base, 1000 ids");
}

int64_t kept(const config::ModelConfig& m) {  // discriminator with its embeddings
  const auto counts = analytic_parameter_counts(m, Architecture::kElectra);
  return count_of(counts, "embeddings") + count_of(counts, "discriminator");
}

TEST(ParameterCounts, PaperSizes) {
  // Base, XLM-R's 250,002 ids: embeddings 250,002 x 768 + 512 x 768 = 192,394,752; per layer
  // 4 x (768^2 + 768) + 2 x 768 x 3072 + 3072 + 768 + 4 x 768 (LayerNorms) + 12 x 32 (d)
  // + 2 x 768 + 12 (u, v, w) = 7,089,804; 12 layers + embedding LayerNorm = 85,079,184.
  const auto base = model_config("base", 250002);
  EXPECT_EQ(kept(base), 277473936);
  EXPECT_NEAR(static_cast<double>(kept(base)) / 279e6, 1.0, 0.02);  // paper: 279M

  // Large and XL with a 500,000-id vocabulary as the issue states them: 814.9M and 2.129B, i.e.
  // 3.0% and 3.2% below the paper's 840M and 2.2B. The architecture cannot reach those figures
  // with exactly 500,000 ids; they are what it gives with ~520-530k ids (below), which is why the
  // _500k configs use 2^19.
  auto large = model_config("large", 500000);
  auto xl = model_config("xl", 500000);
  EXPECT_EQ(kept(large), 814897536);
  EXPECT_EQ(kept(xl), 2128887936);
  EXPECT_NEAR(static_cast<double>(kept(large)) / 840e6, 0.970, 0.001);
  EXPECT_NEAR(static_cast<double>(kept(xl)) / 2.2e9, 0.968, 0.001);
  // With 2^19 = 524,288 ids (large_500k.yaml, xl_500k.yaml): each id adds one row of the
  // embedding, 1,024 (Large) or 1,536 (XL) parameters, so 24,288 more ids add 24,870,912 and
  // 37,306,368: 839,768,448 (0.03% below 840M) and 2,166,194,304 (1.5% below 2.2B).
  large.vocab_size = xl.vocab_size = 524288;
  EXPECT_EQ(kept(large), int64_t{814897536} + 24288 * 1024);
  EXPECT_EQ(kept(xl), int64_t{2128887936} + 24288 * 1536);
  EXPECT_NEAR(static_cast<double>(kept(large)) / 840e6, 1.0, 0.03);
  EXPECT_NEAR(static_cast<double>(kept(xl)) / 2.2e9, 1.0, 0.03);
}

// Every shipped model config as loaded (its own vocabulary; tiny and small take the tokenizer's,
// the demo's 8,000 ids): the count its header comment states, written there digit for digit, and
// its distance from the paper's figure where it claims one.
TEST(ParameterCounts, ShippedConfigsHaveTheCountsTheirCommentsState) {
  struct Stated {
    const char* name;
    int64_t vocab_if_tokenizer;  // the tokenizer's size when the config says 0
    int64_t kept;
    const char* written;  // as the comment writes it
    double paper;         // 0 = not a size from the paper
    double off;           // kept / paper - 1
  };
  for (const Stated& s : {Stated{"tiny", 8000, 645'252, "645,252", 0, 0},
                          Stated{"small", 8000, 10'607'664, "10,607,664", 0, 0},
                          Stated{"base", 0, 277'473'936, "277,473,936", 279e6, -0.005},
                          Stated{"large", 0, 558'899'584, "558,899,584", 840e6, -0.335},
                          Stated{"xl", 0, 1'744'891'008, "1,744,891,008", 2.2e9, -0.207},
                          Stated{"large_500k", 0, 839'768'448, "839,768,448", 840e6, -0.0003},
                          Stated{"xl_500k", 0, 2'166'194'304, "2,166,194,304", 2.2e9, -0.015}}) {
    SCOPED_TRACE(s.name);
    const std::string path = std::string(XLME_SOURCE_DIR) + "/configs/model/" + s.name + ".yaml";
    auto m = config::load_config(path).model;
    EXPECT_EQ(m.vocab_size == 0, s.vocab_if_tokenizer > 0);
    if (m.vocab_size == 0) m.vocab_size = s.vocab_if_tokenizer;
    EXPECT_EQ(kept(m), s.kept);
    EXPECT_TRUE(testing::contains_all(testing::read_file(path), {s.written}));
    if (s.paper > 0) {
      EXPECT_NEAR(static_cast<double>(s.kept) / s.paper - 1.0, s.off, 0.0005);
    }
  }
}

TEST(ParameterCounts, TableNamesModulesAndTotals) {
  const auto table = format_parameter_table(
      analytic_parameter_counts(model_config("base", 250002), Architecture::kElectra));
  EXPECT_TRUE(testing::contains_all(
      table, {"embeddings", "192,394,752", "discriminator", "85,079,184", "generator_head", "total",
              "discriminator + embeddings (kept)", "277,473,936"}));
}

}  // namespace
}  // namespace xlme::model
