// The weight_grad op (ops/weight_gradient.h): with a .grad buffer in place, a product's backward
// adds the weight's gradient into it and hands autograd an empty gradient. In float64 every
// gradient equals LibTorch's autograd (single, stacked and shared weights, the tied table with its
// lookups); under bf16 autocast the buffer gets the fp32 product of the bf16 operands, not a
// bf16-rounded one; without a buffer, under no_grad or with the reference, nothing changes; a
// trainer's steps equal the reference's.
#include "xlme/ops/weight_gradient.h"

#include "xlme/common/precision.h"
#include "xlme/ops/embedding.h"
#include "xlme/ops/linear.h"
#include "xlme/ops/masked_lm.h"
#include "xlme/ops/registry.h"

#include "test_util.h"
#include "train_fixtures.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace xlme::ops {
namespace {

using xlme::testing::error_message;

// Restores the default op choices when a test that changed them ends.
struct DefaultOpsRestored {
  ~DefaultOpsRestored() { set_ops(""); }
};

// A .grad for `leaf` that is a view of a flat buffer (as the trainer's buckets give it) holding
// `earlier`, with `margin` elements on either side that must stay zero.
struct Buffer {
  torch::Tensor flat;
  int64_t margin = 5;
  Buffer(torch::Tensor& leaf, const torch::Tensor& earlier) {
    flat = torch::zeros({leaf.numel() + 2 * margin}, leaf.options().requires_grad(false));
    view().copy_(earlier.reshape(-1));
    leaf.mutable_grad() = view().view(leaf.sizes());
  }
  torch::Tensor view() const { return flat.narrow(0, margin, flat.size(0) - 2 * margin); }
  bool margins_untouched() const {
    return flat.narrow(0, 0, margin).abs().sum().item<double>() == 0.0 &&
           flat.narrow(0, flat.size(0) - margin, margin).abs().sum().item<double>() == 0.0;
  }
};

std::vector<torch::Tensor> leaves_like(const std::vector<torch::Tensor>& values) {
  std::vector<torch::Tensor> out;
  for (const auto& v : values) out.push_back(v.detach().clone().requires_grad_());
  return out;
}

TEST(OpsWeightGradient, InPlaceEqualsAutogradInFloat64) {
  const DefaultOpsRestored restore;
  torch::manual_seed(1);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const std::vector<torch::Tensor> values = {torch::randn({12, 16}, opts), torch::randn({12}, opts),
                                             torch::randn({4, 12}, opts), torch::randn({4}, opts)};
  const auto x0 = torch::randn({5, 7, 16}, opts);
  // Two layers; the loss is not linear in either, so that every gradient depends on the others.
  const auto loss = [&](const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
    return linear(torch::tanh(linear(x, p[0], p[1])), p[2], p[3]).pow(2).sum();
  };
  // The reference: LibTorch's autograd, no buffers.
  set_ops("weight_grad=reference");
  auto reference = leaves_like(values);
  auto x_ref = x0.clone().requires_grad_();
  loss(reference, x_ref).backward();
  // In place, into buffers that hold an earlier micro-batch's gradients.
  set_ops("weight_grad=fused");
  auto fused = leaves_like(values);
  std::vector<torch::Tensor> earlier;
  std::vector<Buffer> buffers;
  for (auto& p : fused) {
    earlier.push_back(torch::randn(p.sizes(), opts));
    buffers.emplace_back(p, earlier.back());
  }
  ASSERT_TRUE(weight_gradient_in_place(fused[0]));
  const auto* storage = fused[0].grad().data_ptr<double>();
  auto x = x0.clone().requires_grad_();
  loss(fused, x).backward();
  EXPECT_EQ(fused[0].grad().data_ptr<double>(), storage) << "the buffer was replaced";
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_TRUE(torch::allclose(fused[i].grad(), earlier[i] + reference[i].grad(), 1e-12, 1e-12))
        << "parameter " << i;
    EXPECT_TRUE(buffers[i].margins_untouched()) << "parameter " << i;
  }
  EXPECT_TRUE(torch::allclose(x.grad(), x_ref.grad(), 1e-12, 1e-12));
}

// The generator's logits with rows padded to a multiple of 64 ids (linear's row_multiple, what
// ops::logits_row_multiple asks for where the fused masked-LM op runs): a [N, V] view of a
// [N, 128] buffer, written by the product in place; the same logits bit for bit as the unpadded
// product, hence the same masked-LM loss bit for bit, and the same gradients (float64, to the
// order of the products' sums) with and without a .grad buffer in place.
TEST(OpsWeightGradient, PaddedLogitsGiveTheUnpaddedLossAndGradients) {
  const DefaultOpsRestored restore;
  torch::manual_seed(4);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const int64_t vocab = 100;
  const std::vector<torch::Tensor> values = {torch::randn({vocab, 16}, opts),
                                             torch::randn({vocab}, opts)};
  const auto h0 = torch::randn({6, 16}, opts);
  const auto targets = torch::randint(vocab, {6}, opts.dtype(torch::kInt64));
  struct Run {
    torch::Tensor logits, loss, dh, dw, db;
  };
  const auto run = [&](int64_t row_multiple, bool buffers) {
    auto p = leaves_like(values);
    std::vector<Buffer> kept;
    if (buffers) {
      for (auto& leaf : p) kept.emplace_back(leaf, torch::zeros(leaf.sizes(), opts));
    }
    auto h = h0.clone().requires_grad_();
    const auto logits = linear(h, p[0], p[1], row_multiple);
    const auto lm = masked_lm(logits, targets);
    lm.loss_sum.backward();
    return Run{logits.detach(), lm.loss_sum.detach(), h.grad(), p[0].grad(), p[1].grad()};
  };
  for (const char* spec : {"weight_grad=reference", "weight_grad=fused"}) {
    set_ops(spec);
    const bool buffers = std::string(spec) == "weight_grad=fused";
    const Run plain = run(1, buffers);
    const Run padded = run(64, buffers);
    EXPECT_EQ(plain.logits.stride(0), vocab);
    EXPECT_EQ(padded.logits.stride(0), 128) << spec;
    EXPECT_EQ(padded.logits.sizes(), plain.logits.sizes());
    EXPECT_TRUE(torch::equal(padded.logits, plain.logits)) << spec;
    EXPECT_TRUE(torch::equal(padded.loss, plain.loss)) << spec;
    EXPECT_TRUE(torch::allclose(padded.dh, plain.dh, 1e-12, 1e-12)) << spec;
    EXPECT_TRUE(torch::allclose(padded.dw, plain.dw, 1e-12, 1e-12)) << spec;
    EXPECT_TRUE(torch::allclose(padded.db, plain.db, 1e-12, 1e-12)) << spec;
  }
  // A vocabulary that is a multiple already, or a multiple of 1: no padding.
  EXPECT_EQ(linear(h0, values[0].narrow(0, 0, 64), values[1].narrow(0, 0, 64), 64).stride(0), 64);
  EXPECT_EQ(linear(h0, values[0], values[1], 1).stride(0), vocab);
  // Where the masked-LM op runs fused (on CUDA) the logits are padded; elsewhere not.
  set_ops("masked_lm=fused");
  EXPECT_EQ(logits_row_multiple(torch::Device(torch::kCUDA, 0)), 64);
  EXPECT_EQ(logits_row_multiple(torch::Device(torch::kCPU)), 1);
  set_ops("masked_lm=reference");
  EXPECT_EQ(logits_row_multiple(torch::Device(torch::kCUDA, 0)), 1);
}

TEST(OpsWeightGradient, StackedWeightsEachGetTheirOwnGradient) {
  // Attention's query, key and value as one product: q and v with buffers, k without one (its
  // gradient reaches autograd as a product), and the biases through autograd.
  const DefaultOpsRestored restore;
  set_ops("weight_grad=fused");
  torch::manual_seed(2);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  std::vector<torch::Tensor> weights, biases;
  for (int i = 0; i < 3; ++i) {
    weights.push_back(torch::randn({6, 10}, opts).requires_grad_());
    biases.push_back(torch::randn({6}, opts).requires_grad_());
  }
  const auto x = torch::randn({3, 4, 10}, opts);
  const auto upstream = torch::randn({3, 4, 18}, opts);
  Buffer q(weights[0], torch::zeros({6, 10}, opts)), v(weights[2], torch::zeros({6, 10}, opts));
  (linear(x, weights, biases) * upstream).sum().backward();
  // The reference: one product of the concatenated leaves.
  const auto w = leaves_like(weights), b = leaves_like(biases);
  (torch::linear(x, torch::cat(w), torch::cat(b)) * upstream).sum().backward();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(weights[i].grad().layout(), torch::kStrided) << i;
    EXPECT_TRUE(torch::allclose(weights[i].grad(), w[i].grad(), 1e-12, 1e-12)) << "weight " << i;
    EXPECT_TRUE(torch::allclose(biases[i].grad(), b[i].grad(), 1e-12, 1e-12)) << "bias " << i;
  }
  EXPECT_TRUE(q.margins_untouched() && v.margins_untouched());
}

TEST(OpsWeightGradient, ASharedWeightAndTheTiedTableGetOneEmptyGradientEach) {
  // A layer used at two depths (share_layers=all) and the token table read twice and projected
  // onto (the generator's tied output): each leaf's gradient is its uses' sum, added in place; the
  // gradient that reaches the leaf (its hooks run once) is empty.
  const DefaultOpsRestored restore;
  set_ops("weight_grad=fused");
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  const auto table0 = torch::randn({30, 8}, opts), layer0 = torch::randn({8, 8}, opts);
  const auto first = torch::tensor({{3, 7, 7, 0, 29}}, torch::kInt64);
  const auto second = torch::tensor({{7, 1}, {3, 3}}, torch::kInt64);
  const auto loss = [&](const torch::Tensor& table, const torch::Tensor& layer, bool through_ops) {
    const auto lookup = [&](const torch::Tensor& ids) {
      return through_ops ? embedding_lookup(table, ids) : torch::embedding(table, ids);
    };
    const auto project = [&](const torch::Tensor& h, const torch::Tensor& w) {
      return through_ops ? linear(h, w, torch::Tensor()) : torch::linear(h, w);
    };
    const auto hidden = project(torch::tanh(project(lookup(first), layer)), layer);  // twice
    return project(hidden, table).pow(2).sum() + lookup(second).cos().sum();
  };
  auto dense_table = table0.clone().requires_grad_(), dense_layer = layer0.clone().requires_grad_();
  loss(dense_table, dense_layer, false).backward();

  auto table = table0.clone().requires_grad_(), layer = layer0.clone().requires_grad_();
  table.mutable_grad() = torch::zeros_like(table0);
  layer.mutable_grad() = torch::zeros_like(layer0);
  std::vector<torch::Tensor> arriving_table, arriving_layer;
  table.register_hook([&](const torch::Tensor& g) { arriving_table.push_back(g); });
  layer.register_hook([&](const torch::Tensor& g) { arriving_layer.push_back(g); });
  loss(table, layer, true).backward();
  ASSERT_EQ(arriving_table.size(), 1u);
  ASSERT_EQ(arriving_layer.size(), 1u);
  for (const auto& [name, g] :
       {std::pair{"table", arriving_table[0]}, {"layer", arriving_layer[0]}}) {
    ASSERT_TRUE(g.is_sparse()) << name << ": " << g.layout();
    EXPECT_EQ(g._nnz(), 0) << name;
  }
  EXPECT_TRUE(torch::allclose(table.grad(), dense_table.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(layer.grad(), dense_layer.grad(), 1e-12, 1e-12));
}

TEST(OpsWeightGradient, UnderBf16AutocastTheBufferGetsTheFp32ProductOfTheBf16Operands) {
  const DefaultOpsRestored restore;
  torch::manual_seed(4);
  const auto x0 = torch::randn({6, 9, 32}), w0 = torch::randn({16, 32}), b0 = torch::randn({16});
  const auto upstream = torch::randn({6, 9, 16});
  struct Run {
    torch::Tensor out, dx, dw, db;
  };
  const auto run = [&](const std::string& ops) {
    set_ops(ops);
    auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
         b = b0.clone().requires_grad_();
    w.mutable_grad() = torch::zeros_like(w0);
    b.mutable_grad() = torch::zeros_like(b0);
    torch::Tensor out;
    {
      const AutocastScope autocast(torch::kCPU, /*enabled=*/true);
      out = linear(x, w, b);
    }
    (out.to(torch::kFloat32) * upstream).sum().backward();
    return Run{out, x.grad(), w.grad(), b.grad()};
  };
  const Run fused = run("weight_grad=fused"), reference = run("weight_grad=reference");
  // The forward and dx are the same product either way.
  EXPECT_EQ(fused.out.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(fused.out, reference.out));
  EXPECT_TRUE(torch::equal(fused.dx, reference.dx));
  // dW exactly: the bf16 upstream gradient times the bf16 input, summed in float64.
  const auto dy = upstream.to(torch::kBFloat16).to(torch::kFloat64).reshape({-1, 16});
  const auto xs = x0.to(torch::kBFloat16).to(torch::kFloat64).reshape({-1, 32});
  const auto exact = dy.t().mm(xs);
  const auto error = [&](const torch::Tensor& t) {
    return ((t.to(torch::kFloat64) - exact).norm() / exact.norm()).item<double>();
  };
  EXPECT_LT(error(fused.dw), 1e-6) << "fp32 accumulation, no bf16 rounding";
  EXPECT_GT(error(reference.dw), 1e-4) << "the reference rounds dW to bf16";
  EXPECT_LT(error(reference.dw), 1e-2);
  const auto exact_db = dy.sum(0);
  EXPECT_LT(((fused.db.to(torch::kFloat64) - exact_db).norm() / exact_db.norm()).item<double>(),
            1e-6);
}

TEST(OpsWeightGradient, WithoutABufferUnderNoGradOrWithTheReferenceNothingChanges) {
  const DefaultOpsRestored restore;
  set_ops("weight_grad=fused");
  const auto w0 = torch::randn({4, 3});
  auto w = w0.clone().requires_grad_();
  EXPECT_FALSE(weight_gradient_in_place(w)) << "no .grad yet";
  const auto x = torch::randn({5, 3});
  linear(x, w, torch::Tensor()).sum().backward();  // LibTorch's product; its gradient becomes .grad
  EXPECT_TRUE(torch::allclose(w.grad(), torch::ones({5, 4}).t().mm(x)));
  EXPECT_TRUE(weight_gradient_in_place(w));
  {
    // A forward under no_grad records nothing; a backward (which runs so) still adds in place.
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(weight_gradient_in_place(w));
    EXPECT_TRUE(adds_into_buffer(w));
  }
  EXPECT_FALSE(weight_gradient_in_place(w0)) << "takes no gradient";
  auto non_leaf = w * 2;
  EXPECT_FALSE(weight_gradient_in_place(non_leaf));
  auto other = w0.clone().requires_grad_();
  other.mutable_grad() = torch::zeros({4, 3}, torch::kFloat64);
  EXPECT_FALSE(weight_gradient_in_place(other)) << "a .grad of another dtype";
  set_ops("weight_grad=reference");
  EXPECT_FALSE(weight_gradient_in_place(w));
  EXPECT_FALSE(adds_into_buffer(w));
}

TEST(OpsWeightGradient, AGradientOfTheWrongShapeIsRefusedNamingTheShapes) {
  auto grad = torch::zeros({4, 6});
  EXPECT_EQ(error_message([&] {
              accumulate_weight_gradient(grad, torch::randn({3, 4}), torch::randn({3, 5}));
            }),
            "weight gradient: dy [3, 4] and x [3, 5] do not give a gradient of [4, 6]");
  accumulate_weight_gradient(grad, torch::ones({2, 4}), torch::ones({2, 6}));
  EXPECT_TRUE(torch::equal(grad, torch::full({4, 6}, 2.0)));
}

// The trainer's steps (buckets attached: every weight in place) equal the reference's, fp32.
TEST(OpsWeightGradient, TrainerStepsEqualTheReferencesSteps) {
  const DefaultOpsRestored restore;
  auto c = xlme::testing::tiny_train_config(/*batch=*/4, /*micro_batches=*/2, /*dropout=*/0.1);
  const auto source = [&] {
    return data::SyntheticBatches(data::SpecialIds::for_vocab(c.model.vocab_size), 4, 16, 0.15,
                                  /*seed=*/11);
  };
  auto reference_source = source(), fused_source = source();
  train::Trainer reference(c, xlme::testing::make_tiny_model(c, 5), reference_source,
                           xlme::testing::single_process());
  train::Trainer fused(c, xlme::testing::make_tiny_model(c, 5), fused_source,
                       xlme::testing::single_process());
  // What reaches the fused trainer's matrices (linear weights, tables): only empty gradients.
  std::map<std::string, std::pair<int, int>> arrivals;  // name -> (empty, other)
  for (const auto& item : fused.model()->named_parameters()) {
    if (item.value().dim() != 2 || item.key().size() < 7 ||
        item.key().compare(item.key().size() - 7, 7, ".weight") != 0) {
      continue;
    }
    auto& count = arrivals[item.key()];
    item.value().register_hook([&count](const torch::Tensor& g) {
      (g.is_sparse() && g._nnz() == 0 ? count.first : count.second)++;
    });
  }
  ASSERT_GT(arrivals.size(), 10u);
  for (int step = 0; step < 3; ++step) {
    set_ops("weight_grad=reference");
    torch::manual_seed(100 + step);
    const auto a = reference.train_step();
    set_ops("weight_grad=fused");
    torch::manual_seed(100 + step);
    const auto b = fused.train_step();
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss)) << "step " << step;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * a.grad_norm) << "step " << step;
  }
  xlme::testing::expect_same_parameters(reference.model(), fused.model(), 1e-6);
  for (const auto& [name, count] : arrivals) {
    // One per micro-batch: 3 steps of 2 micro-batches of each task (mono and para).
    EXPECT_EQ(count.first, 3 * 2 * 2) << name;
    EXPECT_EQ(count.second, 0) << name;
  }
}

}  // namespace
}  // namespace xlme::ops
