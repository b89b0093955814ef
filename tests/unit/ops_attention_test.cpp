// What the fused attention (ops/attention.h) takes from the model, checked on the CPU (the kernel
// itself runs on a GPU, or through Triton's interpreter in tests/python/test_attention_kernel.py):
// the far distance beyond which the Toeplitz table is constant, the per-distance table the kernel
// reads and the gradient's way back to the bucket table, and the far distance each layer of an
// encoder passes, shared layers included.
#include "xlme/model/attention.h"
#include "xlme/model/encoder.h"
#include "xlme/model/relative_position.h"
#include "xlme/ops/attention.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

namespace xlme {
namespace {

using model::relative_position_bucket;
using model::relative_position_far_distance;

TEST(RelativePositionFarDistance, IsWhereEveryLongerDistanceSharesItsDirectionsLastBucket) {
  // 32 / 128: the last log bucket opens at 8 * 16^(7/8) = 90.5 (model_relative_position_test).
  EXPECT_EQ(relative_position_far_distance(32, 128), 91);
  for (const auto& [buckets, max_distance] : std::vector<std::pair<int64_t, int64_t>>{
           {32, 128}, {8, 16}, {4, 8}, {16, 64}, {64, 256}, {32, 512}}) {
    const int64_t far = relative_position_far_distance(buckets, max_distance);
    const int64_t last = buckets / 2 - 1;
    EXPECT_LE(far, max_distance);
    EXPECT_LT(relative_position_bucket(-(far - 1), buckets, max_distance), last) << buckets;
    for (int64_t distance = far; distance <= 3 * max_distance; ++distance) {
      EXPECT_EQ(relative_position_bucket(-distance, buckets, max_distance), last);
      EXPECT_EQ(relative_position_bucket(distance, buckets, max_distance), buckets / 2 + last);
    }
  }
}

// The model's table d[h, bucket(i - j)] as the kernel reads it: one entry per distance, constant
// beyond the far distance on each side, at Tq = Tk and at Tq != Tk (a corner of the table).
TEST(FusedAttentionInputs, TheDistanceTableIsTheBucketTablePerDistance) {
  torch::manual_seed(4);
  const int64_t heads = 3, length = 300, far = relative_position_far_distance(32, 128);
  const auto d = torch::randn({heads, 32});
  const auto buckets = model::relative_position_buckets(length, 32, 128, torch::kCPU);
  const auto full = model::toeplitz_bias(d, buckets);  // [H, T, T]
  for (const auto& [tq, tk] :
       std::vector<std::pair<int64_t, int64_t>>{{length, length}, {1, 1}, {120, 300}, {300, 7}}) {
    const auto table = full.narrow(1, 0, tq).narrow(2, 0, tk);
    const auto t = ops::distance_table(table);  // [H, Tq + Tk - 1]
    ASSERT_EQ(t.sizes(), (std::vector<int64_t>{heads, tq + tk - 1}));
    EXPECT_EQ(t.scalar_type(), torch::kFloat32);
    for (int64_t delta = -(tk - 1); delta < tq; ++delta) {
      const auto want = d.select(1, relative_position_bucket(delta, 32, 128));
      EXPECT_TRUE(torch::equal(t.select(1, delta + tk - 1), want)) << delta;
      if (delta >= far) {
        EXPECT_TRUE(torch::equal(t.select(1, delta + tk - 1), t.select(1, far + tk - 1)));
      }
      if (delta <= -far) {
        EXPECT_TRUE(torch::equal(t.select(1, delta + tk - 1), t.select(1, -far + tk - 1)));
      }
    }
  }
}

// The kernel's table gradient (per distance) reaches d as the sum over the distances of each
// bucket: what autograd does through distance_table and toeplitz_bias.
TEST(FusedAttentionInputs, TheTableGradientReachesTheBucketsSummedPerBucket) {
  torch::manual_seed(5);
  const int64_t heads = 2, length = 40;
  const auto d = torch::randn({heads, 8}, torch::kDouble).requires_grad_();
  const auto buckets = model::relative_position_buckets(length, 8, 16, torch::kCPU);
  const auto t = ops::distance_table(model::toeplitz_bias(d, buckets));
  const auto grad = torch::randn({heads, 2 * length - 1}, torch::kFloat32);
  t.backward(grad);
  auto want = torch::zeros({heads, 8}, torch::kDouble);
  for (int64_t delta = -(length - 1); delta < length; ++delta) {
    want.select(1, relative_position_bucket(delta, 8, 16)) +=
        grad.select(1, delta + length - 1).to(torch::kDouble);
  }
  EXPECT_TRUE(torch::allclose(d.grad(), want, 1e-6, 1e-6));
}

// The dQ programs' rows of sums (one per sequence, head and query block; by distance, then the
// far sums) added into the table's gradient, against a loop over every row and distance in
// float64; Tq != Tk both ways, far entries inside and beyond the table.
TEST(FusedAttentionInputs, TheTableGradientAddsEveryProgramsRow) {
  torch::manual_seed(6);
  for (const auto& [tq, tk, far] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {50, 50, 10}, {17, 40, 20}, {40, 17, 20}, {33, 33, 0}, {5, 9, 12}}) {
    const int64_t batch = 2, heads = 3, block = 16;
    const int64_t q_blocks = (tq + block - 1) / block, k_blocks = (tk + block - 1) / block;
    const int64_t width = (q_blocks + k_blocks) * block + 2;
    const auto sums = torch::randn({batch * heads, q_blocks, width});
    const auto got = ops::attention_table_gradient(sums, batch, heads, tq, tk, far, block);
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{heads, tq + tk - 1}));
    const auto s = sums.to(torch::kDouble);
    auto want = torch::zeros({heads, tq + tk - 1}, torch::kDouble);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t q = 0; q < q_blocks; ++q) {
          const auto row = s[b * heads + h][q];
          for (int64_t delta = -(tk - 1); delta < tq; ++delta) {
            want[h][delta + tk - 1] += row[delta + k_blocks * block];
          }
          if (far > 0 && far < tq) want[h][tk - 1 + far] += row[width - 2];
          if (far > 0 && far < tk) want[h][tk - 1 - far] += row[width - 1];
        }
      }
    }
    EXPECT_TRUE(torch::allclose(got.to(torch::kDouble), want, 1e-5, 1e-5))
        << tq << " " << tk << " " << far;
  }
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] {
        ops::attention_table_gradient(torch::zeros({6, 2, 10}), 2, 3, 17, 17, 0, 16);
      }),
      {"attention_table_gradient", "[6, 2, 10]", "[6, 2, 66]"}));
}

TEST(FusedAttentionInputs, AFarDistanceBelowZeroIsRefused) {
  const auto q = torch::zeros({1, 1, 4, 32}, torch::kBFloat16);
#ifdef XLME_WITH_CUDA
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { ops::fused_attention(q, q, q, {}, {}, {}, 0.0, false, -1); }),
      {"far (-1)"}));
#else
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([&] { ops::fused_attention(q, q, q, {}, {}, {}, 0.0, false, -1); }),
      {"without CUDA"}));
#endif
}

// Every layer's attention passes the far distance of the model's buckets, the layers an ALBERT
// encoder shares included (the fused path itself: CudaOps.FusedAttentionInAnAlbertSharedEncoder).
TEST(FusedAttentionInputs, EveryLayerKnowsWhereItsTableTurnsConstant) {
  for (const auto sharing :
       {model::LayerSharing::kNone, model::LayerSharing::kAll, model::LayerSharing::kAttention}) {
    config::ModelArgs o;
    o.vocab_size = 50;
    o.hidden_size = 16;
    o.embedding_size = 16;
    o.layers = 3;
    o.heads = 2;
    o.ffn_size = 32;
    o.relative_position.num_buckets = 8;
    o.relative_position.max_distance = 16;
    o.share_layers = sharing;
    for (const bool shared_table : {false, true}) {
      o.relative_position.shared_across_layers = shared_table;
      auto buckets = std::make_shared<model::BucketCache>(o.relative_position.num_buckets,
                                                          o.relative_position.max_distance);
      model::Encoder encoder(o, model::SharedEmbeddings(o), buckets);
      for (int64_t i = 0; i < o.layers; ++i) {
        const auto& attention = encoder->layer(i).attention;
        EXPECT_EQ(attention->args().relative_position.max_distance, 16);
        EXPECT_EQ(attention->far(), relative_position_far_distance(8, 16));
      }
    }
  }
}

}  // namespace
}  // namespace xlme
