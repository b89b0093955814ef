#include "xlme/optim/optimizer.h"

#include "xlme/common/error.h"

#include <ATen/ATen.h>

#include <cmath>
#include <map>

namespace xlme::optim {

torch::Tensor MultiTensorAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  auto& states = state();
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TORCH_CHECK(!options.amsgrad(), "MultiTensorAdamW: amsgrad is not supported");
    const double lr = options.lr(), weight_decay = options.weight_decay(), eps = options.eps();
    const auto [beta1, beta2] = options.betas();
    // Parameters stepped together share their step count (all of them, unless some had no
    // gradient at some step): one set of lists per count.
    struct Lists {
      std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    };
    std::map<int64_t, Lists> by_step;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "MultiTensorAdamW does not take sparse gradients");
      const auto key = p.unsafeGetTensorImpl();
      auto it = states.find(key);
      if (it == states.end()) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = states.emplace(key, std::move(fresh)).first;
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
      Lists& lists = by_step[s.step()];
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.exp_avgs.push_back(s.exp_avg());
      lists.exp_avg_sqs.push_back(s.exp_avg_sq());
      s.step(s.step() + 1);
    }
    for (auto& [previous, lists] : by_step) {
      // The kernel takes the count of this step (PyTorch's _fused_adamw increments before the
      // call): with the count before it, the first step's bias correction 1 - beta^0 is 0 and
      // every parameter becomes NaN (found on the first GPU run).
      auto counts = torch::full({static_cast<int64_t>(lists.params.size())},
                                static_cast<double>(previous + 1),
                                lists.params.front().options().dtype(torch::kFloat32));
      std::vector<torch::Tensor> steps;
      for (int64_t i = 0; i < counts.size(0); ++i) steps.push_back(counts[i]);
      at::_fused_adamw_(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, {}, steps, lr,
                        beta1, beta2, weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
    }
  }
  return loss;
}

torch::Tensor gradient_norm(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  XLME_CHECK(!grads.empty(), "gradient norm: no parameter has a gradient");
  return torch::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat32).norm();
}

void scale_gradients(const std::vector<torch::Tensor>& parameters, double scale) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (!grads.empty()) at::_foreach_mul_(grads, scale);
}

void clear_gradients(const std::vector<torch::Tensor>& parameters) {
  for (auto p : parameters) p.mutable_grad() = torch::Tensor();
}

bool takes_weight_decay(const torch::Tensor& parameter) {
  return parameter.dim() >= 2;
}

std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& parameters,
                                                const config::TrainConfig& train) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    (takes_weight_decay(p) ? decay : no_decay).push_back(p);
  }
  XLME_CHECK(!decay.empty() || !no_decay.empty(), "the optimizer got no trainable parameters");
  auto options = [&](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(train.lr)
            .betas({train.adam_beta1, train.adam_beta2})
            .eps(train.adam_eps)
            .weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(train.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<MultiTensorAdamW>(std::move(groups),
                                            torch::optim::AdamWOptions(train.lr));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    group.options().set_lr(lr);
  }
}

}  // namespace xlme::optim
