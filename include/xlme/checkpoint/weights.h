// Weights by name: a module's parameters and buffers under their dotted names
// (discriminator.layers.0.attention.query.weight), which are also the keys of model.pt,
// model.safetensors and every other weight file xlme reads or writes.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace xlme::checkpoint {

// Throws xlme::Error naming `file` and the first floating-point tensor of `weights` that holds
// NaN or infinite values (a run that diverged before it was saved), so that such weights are not
// exported, fine-tuned or evaluated as if they were sound, nor resumed from.
void check_finite_weights(const std::map<std::string, torch::Tensor>& weights,
                          const std::string& file);

// Every parameter and buffer of `module` by its dotted name: the module's own tensors.
std::map<std::string, torch::Tensor> named_weights(const torch::nn::Module& module);

// What a weight file declares of a tensor, or what a reader expects of it, known before any data
// is read.
struct WeightSpec {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
};
using WeightSpecs = std::map<std::string, WeightSpec>;

// The shape and dtype of every parameter and buffer of `module`, by its dotted name.
WeightSpecs weight_specs(const torch::nn::Module& module);

// "a, b, c" for at most 20 names, then "and N more": the weights an error names.
std::string first_weight_names(const std::vector<std::string>& names);

// Bytes of the data of `specs` (sum of element count times element size).
uint64_t weight_bytes(const WeightSpecs& specs);

// Checks what weight file `file` declares against what the reader's model holds, before any
// tensor data is read: every declared tensor must be expected (an extra one is refused by name,
// however large it claims to be), every expected one declared, with the expected shape, and with
// the expected dtype, or `floating` in place of a floating-point one (a documented conversion:
// a bf16 export read into an fp32 model). An integer or float64 table where fp32 is expected is
// refused naming the tensor and both dtypes. Errors name `file` and end with `hint`.
void check_declared_weights(const WeightSpecs& declared, const WeightSpecs& expected,
                            torch::ScalarType floating, const std::string& file,
                            const std::string& hint);

// How a name -> tensor map matches the parameters and buffers of a module.
struct WeightMatch {
  struct Mismatch {
    std::string name;
    std::vector<int64_t> stored;    // the shape in the weights
    std::vector<int64_t> expected;  // the shape in the module
  };
  std::vector<std::string> matched;       // same name and shape: what copy_weights copies
  std::vector<std::string> missing;       // selected module tensors the weights lack
  std::vector<std::string> unexpected;    // weights the module does not have
  std::vector<std::string> not_selected;  // module tensors outside the selection
  std::vector<Mismatch> mismatched;       // same name, another shape
};

// Matches `weights` against `module`'s parameters and buffers, considering only the module
// tensors for which `selected` is true (all when it is empty). Names in sorted order.
WeightMatch match_weights(const torch::nn::Module& module,
                          const std::map<std::string, torch::Tensor>& weights,
                          const std::function<bool(const std::string&)>& selected = {});

// Copies the tensors that `match` matched from `weights` into `module` (without gradient
// tracking, converted to each target's dtype and device).
void copy_weights(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& weights,
                  const WeightMatch& match);

}  // namespace xlme::checkpoint
