// Relative-distance buckets against hand-written tables, and the bucket cache.
#include "xlme/model/relative_position.h"

#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace xlme::model {
namespace {

// 32 buckets, max distance 128: per direction 16 buckets, 8 exact (0..7), then 8 log-spaced
// buckets starting at 8 * 16^(k/8): 8, 11.3, 16, 22.6, 32, 45.3, 64, 90.5; 128 and beyond clamp.
TEST(RelativePositionBucket, MatchesHandWrittenTable32x128) {
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 0},   {1, 1},   {7, 7},   {8, 8},   {11, 8},   {12, 9},   {15, 9},
      {16, 10}, {22, 10}, {23, 11}, {31, 11}, {32, 12},  {45, 12},  {46, 13},
      {63, 13}, {64, 14}, {90, 14}, {91, 15}, {127, 15}, {128, 15}, {1000, 15}};
  for (const auto& [distance, bucket] : expected) {
    // delta = i - j < 0: the key is to the right of the query (lower half).
    EXPECT_EQ(relative_position_bucket(-distance, 32, 128), bucket) << "delta " << -distance;
    // delta > 0: the key is to the left (upper half), except distance 0.
    EXPECT_EQ(relative_position_bucket(distance, 32, 128), distance == 0 ? 0 : 16 + bucket)
        << "delta " << distance;
  }
}

// 8 buckets, max distance 16: per direction 4 buckets, 2 exact, log buckets from 2 and 5.66.
TEST(RelativePositionBucket, MatchesHandWrittenTable8x16) {
  const int64_t expected_left[] = {0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
  for (int64_t distance = 0; distance < 20; ++distance) {
    EXPECT_EQ(relative_position_bucket(-distance, 8, 16), expected_left[distance]);
    EXPECT_EQ(relative_position_bucket(distance, 8, 16),
              distance == 0 ? 0 : 4 + expected_left[distance]);
  }
}

TEST(RelativePositionBucket, RejectsBadShapes) {
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { relative_position_bucket(1, 7, 128); }), {"even", "7"}));
  EXPECT_TRUE(testing::contains_all(
      testing::error_message([] { relative_position_bucket(1, 32, 8); }), {"max_distance (8)"}));
}

TEST(RelativePositionBuckets, TableIsToeplitzOfTheBucketFunction) {
  const auto table = relative_position_buckets(40, 32, 128, torch::kCPU);
  ASSERT_EQ(table.sizes(), (std::vector<int64_t>{40, 40}));
  for (int64_t i = 0; i < 40; i += 3) {
    for (int64_t j = 0; j < 40; j += 2) {
      EXPECT_EQ(table[i][j].item<int64_t>(), relative_position_bucket(i - j, 32, 128));
    }
  }
}

// One table per device, grown to the longest length and sliced for every shorter one: each slice
// is the table built for its own length.
TEST(BucketCache, SlicesOneTableForEveryLength) {
  BucketCache cache(32, 128);
  const auto longest = cache.get(40, torch::kCPU);
  for (const int64_t length : {1, 7, 13, 40}) {
    const auto slice = cache.get(length, torch::kCPU);
    EXPECT_EQ(slice.data_ptr(), longest.data_ptr()) << length << ": a view of the one table";
    EXPECT_TRUE(torch::equal(slice, relative_position_buckets(length, 32, 128, torch::kCPU)))
        << length;
  }
  // A longer length grows the table; shorter lengths then slice the new one.
  const auto grown = cache.get(57, torch::kCPU);
  EXPECT_TRUE(torch::equal(grown, relative_position_buckets(57, 32, 128, torch::kCPU)));
  const auto after = cache.get(13, torch::kCPU);
  EXPECT_EQ(after.data_ptr(), grown.data_ptr());
  EXPECT_TRUE(torch::equal(after, relative_position_buckets(13, 32, 128, torch::kCPU)));
}

TEST(ToeplitzBias, GathersPerHeadTable) {
  const auto d = torch::arange(16, torch::kDouble).view({2, 8});  // [H, buckets]
  BucketCache cache(8, 16);
  const auto table =
      toeplitz_bias(d, cache.get(9, torch::kCPU).narrow(0, 0, 6).narrow(1, 0, 6));  // [2, 6, 6]
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < 6; ++i) {
      for (int64_t j = 0; j < 6; ++j) {
        EXPECT_EQ(table[h][i][j].item<double>(),
                  d[h][relative_position_bucket(i - j, 8, 16)].item<double>());
      }
    }
  }
}

// The CUDA path's gradient (one product with the one-hot bucket matrix) against index_select's
// (index_add_), on a sliced, non-contiguous bucket table.
TEST(ToeplitzBias, OneHotBackwardEqualsIndexSelects) {
  BucketCache cache(32, 128);
  const auto buckets = cache.get(64, torch::kCPU).narrow(0, 0, 37).narrow(1, 0, 37);
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    torch::manual_seed(3);
    const auto d = torch::randn({3, 32}, dtype);
    const auto grad = torch::randn({3, 37, 37}, dtype);
    const auto a = d.clone().requires_grad_();
    const auto b = d.clone().requires_grad_();
    const auto by_index = toeplitz_bias(a, buckets);  // CPU: index_select
    const auto by_one_hot = toeplitz_bias_one_hot(b, buckets);
    EXPECT_TRUE(torch::equal(by_index, by_one_hot));
    by_index.backward(grad);
    by_one_hot.backward(grad);
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-4;
    EXPECT_TRUE(torch::allclose(b.grad(), a.grad(), tol, tol))
        << (b.grad() - a.grad()).abs().max().item<double>();
    // Not zeros compared with zeros: each bucket the table uses gets a gradient in every head.
    const auto used = torch::bincount(buckets.reshape(-1), {}, 32).gt(0).sum().item<int64_t>();
    EXPECT_GT(used, 16);
    EXPECT_EQ(a.grad().ne(0).sum().item<int64_t>(), 3 * used);
  }
}

}  // namespace
}  // namespace xlme::model
