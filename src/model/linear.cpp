#include "xlme/model/linear.h"

#include <torch/torch.h>

namespace xlme::model {

void init_normal(std::initializer_list<torch::nn::Linear*> layers, double std) {
  torch::NoGradGuard no_grad;
  for (auto* layer : layers) {
    (*layer)->weight.normal_(0.0, std);
    (*layer)->bias.zero_();
  }
}

torch::nn::Linear normal_linear(int64_t in, int64_t out, double std) {
  torch::nn::Linear layer(in, out);
  init_normal({&layer}, std);
  return layer;
}

}  // namespace xlme::model
