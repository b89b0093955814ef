// ops::embedding_lookup: with a dense gradient buffer in place, a lookup's backward adds the rows
// it read into the buffer itself; the table's gradient equals the dense path's, in float64,
// when the table is read twice and used as a tied projection as the generator's token table is.
#include "xlme/ops/embedding.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <vector>

namespace xlme::ops {
namespace {

// The token table's three uses in a micro-batch: two lookups (duplicate ids included) and a tied
// projection; returns the loss to differentiate.
torch::Tensor three_uses(const torch::Tensor& table, bool through_op) {
  const auto first = torch::tensor({3, 7, 7, 0, 49}, torch::kInt64).view({1, 5});
  const auto second = torch::tensor({{7, 1}, {3, 3}}, torch::kInt64);
  const auto lookup = [&](const torch::Tensor& ids) {
    return through_op ? embedding_lookup(table, ids) : torch::embedding(table, ids);
  };
  const auto hidden = lookup(first).sin().sum(1);        // [1, E]
  const auto logits = torch::matmul(hidden, table.t());  // [1, V]: the tied projection
  return logits.pow(2).sum() + lookup(second).cos().sum();
}

TEST(OpsEmbedding, RowsAddIntoTheGradientBufferInPlaceAndEqualTheDensePath) {
  torch::manual_seed(3);
  const auto values = torch::randn({50, 8}, torch::kFloat64);
  // The reference: LibTorch's dense embedding backward, no buffer.
  auto dense = values.clone().requires_grad_();
  three_uses(dense, false).backward();
  // A table whose .grad is a view of a flat buffer holding an earlier micro-batch's gradient.
  auto table = values.clone().requires_grad_();
  auto flat = torch::zeros({10 + 400}, torch::kFloat64);
  const auto earlier = torch::randn({50, 8}, torch::kFloat64);
  flat.narrow(0, 10, 400).copy_(earlier.view(-1));
  table.mutable_grad() = flat.narrow(0, 10, 400).view({50, 8});
  ASSERT_TRUE(embedding_gradient_is_rows(table));
  const auto* storage = table.grad().data_ptr<double>();
  three_uses(table, true).backward();
  EXPECT_EQ(table.grad().layout(), torch::kStrided);
  EXPECT_EQ(table.grad().data_ptr<double>(), storage) << "the buffer was replaced";
  EXPECT_TRUE(
      torch::allclose(flat.narrow(0, 10, 400).view({50, 8}), earlier + dense.grad(), 1e-12, 1e-12));
  EXPECT_EQ(flat.narrow(0, 0, 10).abs().sum().item<double>(), 0.0) << "wrote outside its view";
}

TEST(OpsEmbedding, ALookupAddsItsRowsIntoTheBufferAndHandsAutogradAnEmptyGradient) {
  // What reaches the table from one lookup (autograd sums a table's several uses before its
  // buffer; a hook sees that sum): nothing, the rows read (duplicates summed) having been added
  // into the buffer by the lookup's backward.
  auto table = torch::randn({50, 8}, torch::kFloat64).requires_grad_();
  table.mutable_grad() = torch::zeros_like(table);
  std::vector<torch::Tensor> arriving;
  table.register_hook([&](const torch::Tensor& g) { arriving.push_back(g); });
  const auto ids = torch::tensor({7, 3, 7, 7}, torch::kInt64);
  embedding_lookup(table, ids).backward(torch::ones({4, 8}, torch::kFloat64));
  ASSERT_EQ(arriving.size(), 1u);
  ASSERT_TRUE(arriving[0].is_sparse());
  EXPECT_EQ(arriving[0]._nnz(), 0);
  EXPECT_EQ(arriving[0].sizes(), table.sizes());
  EXPECT_EQ(table.grad().layout(), torch::kStrided);
  auto expected = torch::zeros({50, 8}, torch::kFloat64);
  expected.select(0, 3).fill_(1.0);
  expected.select(0, 7).fill_(3.0);
  EXPECT_TRUE(torch::equal(table.grad(), expected));
}

TEST(OpsEmbedding, WithoutAGradientBufferItIsTheDenseLookup) {
  const auto values = torch::randn({50, 8}, torch::kFloat64);
  auto table = values.clone().requires_grad_();
  EXPECT_FALSE(embedding_gradient_is_rows(table));  // no .grad yet: a sparse one would stay
  three_uses(table, true).backward();
  EXPECT_EQ(table.grad().layout(), torch::kStrided);
  auto dense = values.clone().requires_grad_();
  three_uses(dense, false).backward();
  EXPECT_TRUE(torch::allclose(table.grad(), dense.grad(), 1e-12, 1e-12));
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(embedding_gradient_is_rows(table));
  }
  EXPECT_FALSE(embedding_gradient_is_rows(values));  // takes no gradient
}

TEST(OpsEmbedding, TheRowsAreSummedInAFixedOrder) {
  // The same ids and gradients give the same bits twice (coalesced before they are added).
  torch::manual_seed(5);
  const auto values = torch::randn({1000, 16});
  const auto ids = torch::randint(0, 20, {4096}, torch::kInt64);  // many duplicates
  const auto dout = torch::randn({4096, 16});
  std::vector<torch::Tensor> grads;
  for (int run = 0; run < 2; ++run) {
    auto table = values.clone().requires_grad_();
    table.mutable_grad() = torch::zeros_like(values);
    embedding_lookup(table, ids).backward(dout);
    grads.push_back(table.grad().clone());
  }
  EXPECT_TRUE(torch::equal(grads[0], grads[1]));
  auto dense = values.clone().requires_grad_();
  torch::embedding(dense, ids).backward(dout);
  EXPECT_TRUE(torch::allclose(grads[0], dense.grad(), 1e-5, 1e-5));
}

}  // namespace
}  // namespace xlme::ops
