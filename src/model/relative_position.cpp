#include "xlme/model/relative_position.h"

#include "xlme/common/error.h"
#include "xlme/ops/registry.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace xlme::model {

int64_t relative_position_bucket(int64_t delta, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;
  const int64_t exact = half / 2;
  XLME_CHECK(num_buckets % 2 == 0 && exact >= 1 && max_distance > exact,
             "relative position buckets need an even num_buckets >= 4 ({}) and max_distance ({}) "
             "above the {} exact buckets per direction",
             num_buckets, max_distance, exact);
  const int64_t offset = delta > 0 ? half : 0;
  const int64_t distance = std::abs(delta);
  if (distance < exact) return offset + distance;
  const double scaled = std::log(static_cast<double>(distance) / static_cast<double>(exact)) /
                        std::log(static_cast<double>(max_distance) / static_cast<double>(exact)) *
                        static_cast<double>(half - exact);
  const auto log_bucket = exact + static_cast<int64_t>(std::floor(scaled + 1e-9));
  return offset + std::min(log_bucket, half - 1);
}

int64_t relative_position_far_distance(int64_t num_buckets, int64_t max_distance) {
  // Buckets grow with the distance and are symmetric in direction (the offset aside), so the
  // first distance in the last bucket of the left half is the answer for both halves.
  const int64_t last = num_buckets / 2 - 1;
  int64_t far = 1;
  while (relative_position_bucket(-far, num_buckets, max_distance) < last) ++far;
  return far;
}

torch::Tensor relative_position_buckets(int64_t length, int64_t num_buckets, int64_t max_distance,
                                        const torch::Device& device) {
  // One bucket per distance -(T-1) .. T-1, then the Toeplitz expansion on the host.
  std::vector<int64_t> per_delta(static_cast<size_t>(2 * length - 1));
  for (int64_t delta = -(length - 1); delta < length; ++delta) {
    per_delta[static_cast<size_t>(delta + length - 1)] =
        relative_position_bucket(delta, num_buckets, max_distance);
  }
  auto table = torch::empty({length, length}, torch::kInt64);
  auto* out = table.data_ptr<int64_t>();
  for (int64_t i = 0; i < length; ++i) {
    for (int64_t j = 0; j < length; ++j) {
      out[i * length + j] = per_delta[static_cast<size_t>(i - j + length - 1)];
    }
  }
  return table.to(device);
}

torch::Tensor BucketCache::get(int64_t length, const torch::Device& device) {
  auto& table = tables_[device.str()];
  if (!table.defined() || table.size(0) < length) {
    table = relative_position_buckets(length, num_buckets_, max_distance_, device);
  }
  return table.narrow(0, 0, length).narrow(1, 0, length);
}

namespace {

torch::Tensor gather_buckets(const torch::Tensor& d, const torch::Tensor& buckets) {
  const int64_t length = buckets.size(0);
  // reshape copies the index of a shorter length out of the cached table ([T * T] int64).
  return d.index_select(1, buckets.reshape(-1)).view({d.size(0), length, length});
}

struct OneHotToeplitzBias : torch::autograd::Function<OneHotToeplitzBias> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& d,
                               const torch::Tensor& buckets) {
    ctx->save_for_backward({buckets});
    ctx->saved_data["num_buckets"] = d.size(1);
    return gather_buckets(d, buckets);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto buckets = ctx->get_saved_variables()[0];
    const int64_t num_buckets = ctx->saved_data["num_buckets"].toInt();
    const auto& grad = grads[0];
    // [T * T, K] by a scatter, not torch::one_hot, whose range check reads the index's minimum
    // and maximum back to the host: a synchronization per layer on a GPU.
    const auto one_hot = torch::zeros({buckets.numel(), num_buckets}, grad.options())
                             .scatter_(1, buckets.reshape({-1, 1}), 1.0);
    return {grad.reshape({grad.size(0), -1}).mm(one_hot), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor toeplitz_bias_one_hot(const torch::Tensor& d, const torch::Tensor& buckets) {
  return OneHotToeplitzBias::apply(d, buckets);
}

torch::Tensor toeplitz_bias(const torch::Tensor& d, const torch::Tensor& buckets) {
  return ops::implementation(ops::Op::kToeplitzBias, d.device()) == ops::Impl::kFused
             ? toeplitz_bias_one_hot(d, buckets)
             : gather_buckets(d, buckets);
}

}  // namespace xlme::model
