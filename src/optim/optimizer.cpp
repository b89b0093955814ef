#include "xlme/optim/optimizer.h"

#include "xlme/common/error.h"
#include "xlme/common/runtime.h"
#include "xlme/common/torch_compat.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#if XLME_HAS_OWN_CPU_ADAMW
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <map>

namespace xlme::optim {

namespace {

#if XLME_HAS_OWN_CPU_ADAMW
// AdamW's constants as LibTorch's CPU kernels apply them to float32 tensors: each Scalar argument
// computed in double, then rounded to float.
struct AdamWConstants {
  float decay;  // p.mul_(1 - lr * weight_decay)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // denom.div_(sqrt(1 - beta2^step))
  float eps;                    // denom.add_(eps)
  float step_size;              // p.addcdiv_(exp_avg, denom, -lr / (1 - beta1^step))
  bool weight_decay;
};

// One parameter's elements [begin, end): LibTorch's five AdamW operations in one pass, element by
// element with the rounding of ATen's CPU kernels (measured against them: add_ with alpha and
// addcmul_ are fused multiply-adds, addcdiv_ is not, every Scalar is a float), so that the
// parameters and moments equal LibTorch's bit for bit.
__attribute__((target("avx2,fma"))) void adamw_span(float* p, const float* g, float* m, float* v,
                                                    int64_t begin, int64_t end,
                                                    const AdamWConstants& c) {
  int64_t i = begin;
  const __m256 decay = _mm256_set1_ps(c.decay), b1 = _mm256_set1_ps(c.beta1),
               omb1 = _mm256_set1_ps(c.one_minus_beta1), b2 = _mm256_set1_ps(c.beta2),
               omb2 = _mm256_set1_ps(c.one_minus_beta2),
               bc2 = _mm256_set1_ps(c.bias_correction2_sqrt), eps = _mm256_set1_ps(c.eps),
               step = _mm256_set1_ps(c.step_size);
  for (; i + 8 <= end; i += 8) {
    __m256 pv = _mm256_loadu_ps(p + i);
    const __m256 gv = _mm256_loadu_ps(g + i);
    if (c.weight_decay) pv = _mm256_mul_ps(pv, decay);
    const __m256 mv = _mm256_fmadd_ps(gv, omb1, _mm256_mul_ps(_mm256_loadu_ps(m + i), b1));
    const __m256 vv =
        _mm256_fmadd_ps(_mm256_mul_ps(omb2, gv), gv, _mm256_mul_ps(_mm256_loadu_ps(v + i), b2));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), bc2), eps);
    pv = _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(step, mv), denom));
    _mm256_storeu_ps(m + i, mv);
    _mm256_storeu_ps(v + i, vv);
    _mm256_storeu_ps(p + i, pv);
  }
  for (; i < end; ++i) {
    float pi = p[i];
    if (c.weight_decay) pi *= c.decay;
    m[i] = std::fmaf(g[i], c.one_minus_beta1, m[i] * c.beta1);
    v[i] = std::fmaf(c.one_minus_beta2 * g[i], g[i], v[i] * c.beta2);
    const float denom = std::sqrt(v[i]) / c.bias_correction2_sqrt + c.eps;
    p[i] = pi + (c.step_size * m[i]) / denom;
  }
}

// Whether every tensor of the step is a contiguous float32 CPU tensor of its parameter's size.
bool fused_cpu_step_fits(const std::vector<torch::Tensor>& params,
                         const std::vector<torch::Tensor>& grads,
                         const std::vector<torch::Tensor>& exp_avgs,
                         const std::vector<torch::Tensor>& exp_avg_sqs) {
  if (!runtime::cpu_has_avx2_fma()) return false;
  const auto fits = [](const torch::Tensor& t, const torch::Tensor& p) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() &&
           t.numel() == p.numel();
  };
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!fits(params[i], params[i]) || !fits(grads[i], params[i]) ||
        !fits(exp_avgs[i], params[i]) || !fits(exp_avg_sqs[i], params[i])) {
      return false;
    }
  }
  return true;
}

// The fused CPU step over all parameters of a group: spans of at most 32k elements, spread over
// LibTorch's threads (element-wise, so the split does not change a bit).
void fused_cpu_step(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads,
                    std::vector<torch::Tensor>& exp_avgs, std::vector<torch::Tensor>& exp_avg_sqs,
                    const AdamWConstants& constants) {
  constexpr int64_t kSpan = 32768;
  struct Span {
    std::size_t tensor;
    int64_t begin, end;
  };
  std::vector<Span> spans;
  for (std::size_t t = 0; t < params.size(); ++t) {
    for (int64_t b = 0; b < params[t].numel(); b += kSpan) {
      spans.push_back({t, b, std::min(params[t].numel(), b + kSpan)});
    }
  }
  at::parallel_for(0, static_cast<int64_t>(spans.size()), 1, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      const Span& span = spans[static_cast<std::size_t>(s)];
      adamw_span(params[span.tensor].data_ptr<float>(), grads[span.tensor].data_ptr<float>(),
                 exp_avgs[span.tensor].data_ptr<float>(),
                 exp_avg_sqs[span.tensor].data_ptr<float>(), span.begin, span.end, constants);
    }
  });
}

#endif  // XLME_HAS_OWN_CPU_ADAMW

}  // namespace

bool fused_cpu_adamw_available() {
#if XLME_HAS_OWN_CPU_ADAMW
  return runtime::cpu_has_avx2_fma();
#else
  return false;
#endif
}

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
      const auto key = compat::optimizer_state_key(states, p);
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
      const auto step = static_cast<double>(previous + 1);
#if XLME_HAS_FUSED_ADAMW
      if (lists.params.front().is_cuda()) {
        // The kernel takes the count of this step (PyTorch's _fused_adamw increments before
        // the call): with the count before it, the first step's bias correction 1 - beta^0 is
        // 0 and every parameter becomes NaN (found on the first GPU run).
        auto counts = torch::full({static_cast<int64_t>(lists.params.size())}, step,
                                  lists.params.front().options().dtype(torch::kFloat32));
        std::vector<torch::Tensor> steps;
        for (int64_t i = 0; i < counts.size(0); ++i) steps.push_back(counts[i]);
        at::_fused_adamw_(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, {}, steps,
                          lr, beta1, beta2, weight_decay, eps, /*amsgrad=*/false,
                          /*maximize=*/false);
        continue;
      }
#endif
      const double bias_correction1 = 1 - std::pow(beta1, step);
      const double bias_correction2 = 1 - std::pow(beta2, step);
#if XLME_HAS_OWN_CPU_ADAMW
      if (fused_cpu_step_fits(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs)) {
        AdamWConstants c;
        c.decay = static_cast<float>(1 - lr * weight_decay);
        c.weight_decay = weight_decay != 0;
        c.beta1 = static_cast<float>(beta1);
        c.one_minus_beta1 = static_cast<float>(1 - beta1);
        c.beta2 = static_cast<float>(beta2);
        c.one_minus_beta2 = static_cast<float>(1 - beta2);
        c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
        c.eps = static_cast<float>(eps);
        c.step_size = static_cast<float>(-lr / bias_correction1);
        fused_cpu_step(lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, c);
        continue;
      }
#endif
      // LibTorch's AdamW::step, operation for operation, over lists.
      if (weight_decay != 0) at::_foreach_mul_(lists.params, 1 - lr * weight_decay);
      at::_foreach_mul_(lists.exp_avgs, beta1);
      at::_foreach_add_(lists.exp_avgs, lists.grads, 1 - beta1);
      at::_foreach_mul_(lists.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(lists.exp_avg_sqs, lists.grads, lists.grads, 1 - beta2);
      auto denom = at::_foreach_sqrt(lists.exp_avg_sqs);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, eps);
      at::_foreach_addcdiv_(lists.params, lists.exp_avgs, denom, -lr / bias_correction1);
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
