// ALBERT's cross-layer parameter sharing (model.share_layers): a shared encoder computes what an
// unshared one computes when its layers hold equal weights, a shared weight's gradient is the sum
// of the per-layer gradients, every parameter is registered once, the counts follow, and ALBERT's
// published base size comes out.
#include "xlme/finetune/model.h"
#include "xlme/model/electra.h"
#include "xlme/model/encoder.h"
#include "xlme/model/parameter_count.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace xlme::model {
namespace {

config::ModelArgs sharing_test_options(LayerSharing sharing) {
  config::ModelArgs o;
  o.vocab_size = 50;
  o.max_positions = 16;
  o.embedding_size = 8;  // factorized: ALBERT's embeddings
  o.hidden_size = 16;
  o.layers = 3;
  o.heads = 2;
  o.ffn_size = 32;
  o.dropout = 0.0;
  o.attention_dropout = 0.0;
  o.relative_position.num_buckets = 8;
  o.relative_position.max_distance = 16;
  o.attention = config::AttentionChoice::kMath;
  o.share_layers = sharing;
  return o;
}

struct SharedAndUnshared {
  Encoder shared{nullptr};
  Encoder unshared{nullptr};
};

// An encoder with `sharing` and an unshared one whose every layer holds the shared weights.
SharedAndUnshared equal_encoders(LayerSharing sharing) {
  torch::manual_seed(3);
  auto options = sharing_test_options(sharing);
  SharedEmbeddings embeddings(options);
  auto buckets = std::make_shared<BucketCache>(options.relative_position.num_buckets,
                                               options.relative_position.max_distance);
  SharedAndUnshared e{Encoder(options, embeddings, buckets), nullptr};
  auto plain = options;
  plain.share_layers = LayerSharing::kNone;
  e.unshared = Encoder(plain, embeddings, buckets);
  const auto from = e.shared->named_parameters();
  torch::NoGradGuard no_grad;
  for (auto& item : e.unshared->named_parameters()) {
    std::string name = item.key();
    if (!from.contains(name)) {
      // layers.<i>.<sub-layer> is shared: its weights are layers.0's.
      const auto dot = name.find('.', std::string("layers.").size());
      name = "layers.0" + name.substr(dot);
    }
    item.value().copy_(from[name]);
  }
  return e;
}

const std::vector<std::pair<LayerSharing, std::string>> kSharings = {
    {LayerSharing::kAll, "all"},
    {LayerSharing::kAttention, "attention"},
    {LayerSharing::kFfn, "ffn"}};

TEST(LayerSharing, SharedEncoderEqualsUnsharedWithEqualLayersAndSumsTheirGradients) {
  for (const auto& [sharing, what] : kSharings) {
    auto e = equal_encoders(sharing);
    e.shared->eval();
    e.unshared->eval();
    const auto ids = torch::randint(50, {2, 7}, torch::kInt64);
    const auto positions = torch::arange(7).expand({2, 7});
    auto padding = torch::zeros({2, 7}, torch::kBool);
    padding[1][6] = true;
    const auto out_shared = e.shared->forward(ids, positions, padding);
    const auto out_unshared = e.unshared->forward(ids, positions, padding);
    EXPECT_TRUE(torch::allclose(out_shared, out_unshared, 1e-5, 1e-6)) << what;
    out_shared.pow(2).sum().backward();
    out_unshared.pow(2).sum().backward();
    // Every shared weight's gradient is the sum of the per-layer copies' gradients.
    const auto unshared = e.unshared->named_parameters();
    int64_t checked = 0;
    for (const auto& item : e.shared->named_parameters()) {
      if (item.key().rfind("layers.", 0) != 0) {
        EXPECT_TRUE(torch::allclose(item.value().grad(), unshared[item.key()].grad(), 1e-4, 1e-6))
            << what << ": " << item.key();
        continue;
      }
      const auto rest = item.key().substr(item.key().find('.', 7));  // ".attention.query.weight"
      const bool attention = rest.rfind(".attention", 0) == 0;
      const bool shared =
          sharing == LayerSharing::kAll || (sharing == LayerSharing::kAttention) == attention;
      auto expected = unshared[item.key()].grad().clone();
      if (shared) {
        for (int i = 1; i < 3; ++i)
          expected += unshared["layers." + std::to_string(i) + rest].grad();
        ++checked;
      }
      EXPECT_TRUE(torch::allclose(item.value().grad(), expected, 1e-4, 1e-5))
          << what << ": " << item.key();
    }
    EXPECT_GT(checked, 0) << what;
  }
}

TEST(LayerSharing, EverySharedParameterIsRegisteredOnce) {
  auto names_of = [](LayerSharing sharing) {
    torch::manual_seed(0);
    auto options = sharing_test_options(sharing);
    SharedEmbeddings embeddings(options);
    Encoder encoder(options, embeddings,
                    std::make_shared<BucketCache>(options.relative_position.num_buckets,
                                                  options.relative_position.max_distance));
    std::vector<std::string> names;
    for (const auto& item : encoder->named_parameters()) names.push_back(item.key());
    return names;
  };
  auto has = [](const std::vector<std::string>& names, const std::string& prefix) {
    for (const auto& n : names) {
      if (n.rfind(prefix, 0) == 0) return true;
    }
    return false;
  };
  const auto all = names_of(LayerSharing::kAll);
  EXPECT_TRUE(has(all, "layers.0.attention.query.") && has(all, "layers.0.ffn_norm."));
  EXPECT_FALSE(has(all, "layers.1."));
  const auto attention = names_of(LayerSharing::kAttention);
  EXPECT_TRUE(has(attention, "layers.0.attention.") && has(attention, "layers.2.ffn."));
  EXPECT_TRUE(has(attention, "layers.2.ffn_norm."));
  EXPECT_FALSE(has(attention, "layers.1.attention") || has(attention, "layers.2.attention"));
  const auto ffn = names_of(LayerSharing::kFfn);
  EXPECT_TRUE(has(ffn, "layers.2.attention.relative_bias") && has(ffn, "layers.0.ffn."));
  EXPECT_FALSE(has(ffn, "layers.1.ffn") || has(ffn, "layers.2.ffn"));
}

TEST(LayerSharing, AnalyticCountsEqualTheBuiltModels) {
  for (const auto& [sharing, what] : kSharings) {
    config::ModelConfig m;
    m.vocab_size = 60;
    m.hidden_size = 16;
    m.embedding_size = 8;
    m.layers = 3;
    m.heads = 2;
    m.ffn_size = 32;
    m.max_positions = 32;
    m.generator.layers = 2;
    m.share_layers = sharing;
    for (const auto architecture : {Architecture::kElectra, Architecture::kMaskedLm}) {
      torch::manual_seed(0);
      ElectraModel model(m, architecture);
      const auto built = parameter_counts(*model);
      const auto analytic = analytic_parameter_counts(m, architecture);
      ASSERT_EQ(built.size(), analytic.size());
      for (size_t i = 0; i < built.size(); ++i) {
        EXPECT_EQ(built[i].count, analytic[i].count) << what << ": " << built[i].module;
      }
    }
  }
}

// ALBERT-base (Lan et al. 2020, Table 1: "12M"): 12 all-shared layers, hidden 768, 12 heads, FFN
// 3072, 128-wide factorized embeddings, 30,000 ids, 512 positions. HuggingFace's albert-base-v2
// AlbertModel has 11,683,584 parameters: ours plus what xlme's encoder has no use for, ALBERT's
// pooler (768 x 768 + 768) and token-type table (2 x 128).
TEST(LayerSharing, AlbertBaseHasAlbertsParameterCount) {
  config::ModelConfig m;
  m.vocab_size = 30000;
  m.hidden_size = 768;
  m.embedding_size = 128;
  m.layers = 12;
  m.heads = 12;
  m.ffn_size = 3072;
  m.max_positions = 512;
  m.relative_position.enabled = false;  // ALBERT has absolute positions only
  m.share_layers = LayerSharing::kAll;
  const auto counts = analytic_parameter_counts(m, Architecture::kMaskedLm);
  const int64_t encoder = count_of(counts, "embeddings") + count_of(counts, "discriminator");
  const int64_t pooler = 768 * 768 + 768, token_types = 2 * 128;
  EXPECT_EQ(encoder + pooler + token_types, 11683584);
  // Unshared, the same shapes have 11 more layers of 7,087,872 parameters.
  m.share_layers = LayerSharing::kNone;
  const auto plain = analytic_parameter_counts(m, Architecture::kMaskedLm);
  EXPECT_EQ(count_of(plain, "discriminator") - count_of(counts, "discriminator"), 11 * 7087872);
}

TEST(LayerSharing, SharedSubLayersTakeTheUndecayedFineTuningRate) {
  using finetune::parameter_depth;
  EXPECT_EQ(parameter_depth("discriminator.layers.0.ffn.output.bias", 12, LayerSharing::kAll), 13);
  EXPECT_EQ(parameter_depth("discriminator.layers.0.attention.query.weight", 12,
                            LayerSharing::kAttention),
            13);
  EXPECT_EQ(parameter_depth("discriminator.layers.4.ffn.output.bias", 12, LayerSharing::kAttention),
            5);
  EXPECT_EQ(parameter_depth("discriminator.layers.0.ffn_norm.weight", 12, LayerSharing::kFfn), 13);
  EXPECT_EQ(parameter_depth("discriminator.layers.6.attention_norm.weight", 12, LayerSharing::kFfn),
            7);
}

TEST(LayerSharing, UnknownNameListsTheChoices) {
  EXPECT_TRUE(testing::contains_all(testing::error_message([] {
                                      config::load_config(
                                          std::string(XLME_SOURCE_DIR) + "/configs/model/tiny.yaml",
                                          {"model.share_layers=both"});
                                    }),
                                    {"model.share_layers", "both"}));
}

}  // namespace
}  // namespace xlme::model
