// Relative-distance buckets and the per-head Toeplitz bias table of the gated relative position
// bias (docs/ARCHITECTURE.md#model).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace xlme::model {

// The bucket of the relative distance `delta = i - j` between query position i and key position
// j (sequence indices). Bidirectional, T5-style: half of the buckets for each direction (keys to
// the left of the query, delta > 0, take the upper half); in each half, the first half of the
// buckets are exact distances and the rest are log-spaced up to `max_distance`, where the last
// bucket of the half takes every longer distance. The log boundaries are computed in double with
// a small tolerance, so that they fall exactly where the formula puts them (distance 16 of
// 32 / 128 opens bucket 10), unlike float32 arithmetic.
int64_t relative_position_bucket(int64_t delta, int64_t num_buckets, int64_t max_distance);

// The smallest distance from which every longer one, in either direction, falls in its direction's
// last bucket: the Toeplitz table is constant beyond it on each side (what the fused attention's
// far tiles rely on, ops/attention.h). 91 for 32 buckets up to 128 (not 128: the log-spaced
// buckets reach the last one before max_distance).
int64_t relative_position_far_distance(int64_t num_buckets, int64_t max_distance);

// [T, T] int64 on `device`: relative_position_bucket(i - j) at (i, j).
torch::Tensor relative_position_buckets(int64_t length, int64_t num_buckets, int64_t max_distance,
                                        const torch::Device& device);

// The [T, T] bucket index of every length, from one table per device: the bucket of (i, j)
// depends on i - j only, so the index of length T is the top-left [T, T] corner of the index of
// any longer length. The table grows to the longest length asked for; the generator and the
// discriminator share one cache.
class BucketCache {
 public:
  BucketCache(int64_t num_buckets, int64_t max_distance)
      : num_buckets_(num_buckets), max_distance_(max_distance) {}

  // [T, T] int64 on `device`: a view into the cached table (not contiguous below its length).
  torch::Tensor get(int64_t length, const torch::Device& device);

  int64_t num_buckets() const { return num_buckets_; }

 private:
  int64_t num_buckets_;
  int64_t max_distance_;
  std::map<std::string, torch::Tensor> tables_;  // device -> [T_max, T_max]
};

// d: [H, num_buckets], buckets: [T, T] (BucketCache) -> [H, T, T]: d_{h, b(i - j)}. The per-head
// Toeplitz table; the attention scales it per (batch, head, query). Where XLME_OPS picks the fused
// form of toeplitz_bias (`auto`: on CUDA) the gradient of d is toeplitz_bias_one_hot's.
torch::Tensor toeplitz_bias(const torch::Tensor& d, const torch::Tensor& buckets);

// The same table, whose backward sums the [H, T * T] gradient into the buckets as one product
// with the [T * T, num_buckets] one-hot matrix of `buckets`, instead of index_select's backward
// (index_add_: on a GPU, T * T atomic adds into num_buckets addresses per head, a sizeable share
// of the step; docs/gpu.md). The forward is index_select's, bit for bit.
torch::Tensor toeplitz_bias_one_hot(const torch::Tensor& d, const torch::Tensor& buckets);

}  // namespace xlme::model
