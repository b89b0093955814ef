// DiscriminatorModel: ElectraModel's discriminator side under the same parameter names, so that
// weights move between the two by name and give the same hidden states and RTD logits.
#include "xlme/model/discriminator.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

namespace xlme::model {
namespace {

using xlme::testing::contains_all;
using xlme::testing::error_message;

bool is_generator_side(const std::string& name) {
  return name.rfind("generator", 0) == 0 || name.rfind("mlm_head", 0) == 0;
}

void expect_same_names_and_shapes(const config::Config& c) {
  ElectraModel electra(c.model, architecture_for(c.objectives.set));
  DiscriminatorModel disc(c.model, architecture_for(c.objectives.set) == Architecture::kElectra);
  std::map<std::string, std::vector<int64_t>> expected, actual;
  for (const auto& p : electra->named_parameters()) {
    if (!is_generator_side(p.key())) expected[p.key()] = p.value().sizes().vec();
  }
  for (const auto& p : disc->named_parameters()) actual[p.key()] = p.value().sizes().vec();
  EXPECT_EQ(actual, expected);
  EXPECT_GT(actual.count("embeddings.token.weight"), 0u);
}

TEST(DiscriminatorModel, HasElectraModelsNamesAndShapes) {
  auto c = xlme::testing::tiny_train_config(2, 1, 0.0);
  expect_same_names_and_shapes(c);
  c.model.embedding_size = 16;
  c.model.embedding_sharing = config::EmbeddingSharing::kGdes;
  c.model.relative_position.shared_across_layers = true;
  c.model.norm = config::Norm::kPre;
  expect_same_names_and_shapes(c);
  c.objectives.set = "mlm";  // no RTD head
  expect_same_names_and_shapes(c);
}

TEST(DiscriminatorModel, ComputesWhatTheElectraDiscriminatorComputes) {
  const auto c = xlme::testing::tiny_train_config(2, 1, 0.0);
  auto electra = xlme::testing::make_tiny_model(c, 5);
  DiscriminatorModel disc(c.model, /*with_head=*/true);
  {
    torch::NoGradGuard no_grad;
    const auto source = electra->named_parameters();
    for (auto& p : disc->named_parameters()) p.value().copy_(source[p.key()]);
  }
  electra->eval();
  disc->eval();
  const auto ids = torch::randint(4, 60, {2, 9}, torch::kLong);
  const auto positions = default_positions(ids);
  auto padding = torch::zeros({2, 9}, torch::kBool);
  padding.index_put_({1, torch::indexing::Slice(6)}, true);
  const auto expected = electra->discriminator->hidden_states(ids, positions, padding);
  const auto actual = disc->hidden_states(ids, {}, padding);
  ASSERT_EQ(actual.size(), 2u);  // embeddings + 1 layer
  for (size_t i = 0; i < actual.size(); ++i) EXPECT_TRUE(torch::equal(actual[i], expected[i]));
  EXPECT_TRUE(torch::equal(disc->forward(ids, positions, padding), expected.back()));
  EXPECT_TRUE(
      torch::equal(disc->rtd_logits(actual.back()), electra->discriminator_head(expected.back())));
  EXPECT_EQ(positions[1][8].item<int64_t>(), 8);
}

TEST(DiscriminatorModel, WithoutTheHeadSaysSo) {
  const auto c = xlme::testing::tiny_train_config(2, 1, 0.0);
  DiscriminatorModel disc(c.model, /*with_head=*/false);
  EXPECT_TRUE(contains_all(error_message([&] {
                             disc->rtd_logits(torch::zeros({1, 2, 32}));
                           }),
                           {"without the replaced-token-detection head"}));
  auto unresolved = c.model;
  unresolved.vocab_size = 0;
  EXPECT_TRUE(contains_all(error_message([&] { DiscriminatorModel(unresolved, true); }),
                           {"model.vocab_size is 0"}));
}

}  // namespace
}  // namespace xlme::model
