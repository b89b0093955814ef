#include "xlme/optim/zero.h"

#include "xlme/common/error.h"
#include "xlme/optim/optimizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <utility>

namespace xlme::optim {

ShardedAdamW::ShardedAdamW(std::vector<torch::Tensor> parameters,
                           std::vector<ShardSegment> segments, int64_t shard_size,
                           const config::TrainConfig& train)
    : parameters_(std::move(parameters)),
      segments_(std::move(segments)),
      train_(train),
      steps_(parameters_.size(), 0) {
  XLME_CHECK(!parameters_.empty(), "ZeRO-1: the optimizer got no parameters");
  const auto options = torch::TensorOptions(torch::kFloat32).device(parameters_.front().device());
  exp_avg_ = torch::zeros({shard_size}, options);
  exp_avg_sq_ = torch::zeros({shard_size}, options);
}

void ShardedAdamW::step(const torch::Tensor& gradients, const std::vector<char>& present,
                        double lr) {
  torch::NoGradGuard no_grad;
  XLME_CHECK(present.size() == parameters_.size(),
             "ZeRO-1: {} presence flags for {} parameters (an internal error: please report it)",
             present.size(), parameters_.size());
  // The pieces stepped together: one weight decay and one step count (MultiTensorAdamW's groups).
  struct Lists {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  };
  std::map<std::pair<bool, int64_t>, Lists> by_kind;
  for (const ShardSegment& s : segments_) {
    const torch::Tensor& p = parameters_[s.param];
    if (!present[s.param] || !p.requires_grad()) continue;
    Lists& lists = by_kind[{takes_weight_decay(p), steps_[s.param]}];
    lists.params.push_back(p.detach().view(-1).narrow(0, s.param_offset, s.size));
    lists.grads.push_back(gradients.narrow(0, s.shard_offset, s.size));
    lists.exp_avgs.push_back(exp_avg_.narrow(0, s.shard_offset, s.size));
    lists.exp_avg_sqs.push_back(exp_avg_sq_.narrow(0, s.shard_offset, s.size));
  }
  for (auto& [kind, lists] : by_kind) {
    const auto [decays, previous] = kind;
    // The count of this step, as MultiTensorAdamW hands it to the kernel.
    auto counts = torch::full({static_cast<int64_t>(lists.params.size())},
                              static_cast<double>(previous + 1), exp_avg_.options());
    std::vector<torch::Tensor> steps;
    for (int64_t i = 0; i < counts.size(0); ++i) steps.push_back(counts[i]);
    at::_fused_adamw_(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, {}, steps, lr,
                      train_.adam_beta1, train_.adam_beta2, decays ? train_.weight_decay : 0.0,
                      train_.adam_eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  // Every rank counts every parameter's steps, its shard's or not: the checkpoint needs them all.
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (present[i] && parameters_[i].requires_grad()) ++steps_[i];
  }
}

void ShardedAdamW::take_shard_of(torch::optim::AdamW& full) {
  torch::NoGradGuard no_grad;
  auto& states = full.state();
  std::fill(steps_.begin(), steps_.end(), 0);
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const auto it = states.find(parameters_[i].unsafeGetTensorImpl());
    if (it == states.end()) continue;
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    steps_[i] = s.step();
  }
  for (const ShardSegment& s : segments_) {
    const auto it = states.find(parameters_[s.param].unsafeGetTensorImpl());
    if (it == states.end()) continue;
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    exp_avg_.narrow(0, s.shard_offset, s.size)
        .copy_(state.exp_avg().reshape(-1).narrow(0, s.param_offset, s.size));
    exp_avg_sq_.narrow(0, s.shard_offset, s.size)
        .copy_(state.exp_avg_sq().reshape(-1).narrow(0, s.param_offset, s.size));
  }
  states.clear();
}

void ShardedAdamW::put_whole_into(torch::optim::AdamW& full,
                                  const std::vector<torch::Tensor>& exp_avg,
                                  const std::vector<torch::Tensor>& exp_avg_sq) const {
  auto& states = full.state();
  states.clear();
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (steps_[i] == 0) continue;  // never stepped: MultiTensorAdamW has no state for it either
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(steps_[i]);
    state->exp_avg(exp_avg[i]);
    state->exp_avg_sq(exp_avg_sq[i]);
    states.emplace(parameters_[i].unsafeGetTensorImpl(), std::move(state));
  }
}

}  // namespace xlme::optim
