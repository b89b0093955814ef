#include "xlme/train/validation.h"

#include "xlme/common/error.h"
#include "xlme/train/precision.h"
#include "xlme/train/rng.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>

namespace xlme::train {

Validator::Validator(const config::Config& config, const std::vector<data::HeldoutPair>& pairs,
                     const data::SpecialIds& special)
    : objectives_(config.objectives), pad_(special.pad), seed_(config.run.seed * 0x5eed + 17) {
  probe_layer_ = config.train.probe_layer >= 0 ? config.train.probe_layer : config.model.layers / 2;
  data::BatchOptions options = data::BatchOptions::from_config(config, nullptr, 0, 1);
  options.ids = special;
  options.mono.enabled = !objectives_.term_names(data::Task::kMono).empty();
  options.para.enabled = !objectives_.term_names(data::Task::kPara).empty();
  batches_ = data::heldout_batches(pairs, options, seed_);
  for (const auto& pair : pairs) {
    ProbePair probe{pair.name, data::framed_sentences(pair.a, config.data.mono.max_len, special),
                    data::framed_sentences(pair.b, config.data.mono.max_len, special)};
    if (!probe.a.empty()) probe_.push_back(std::move(probe));
  }
}

int64_t Validator::tokens() const {
  int64_t n = 0;
  for (const auto& b : batches_) n += b.real_tokens;
  return n;
}

ValidationResult Validator::run(model::ElectraModel& model, dist::Communicator& comm,
                                const torch::Device& device, bool bf16) const {
  const auto start = std::chrono::steady_clock::now();
  ValidationResult result;
  result.probe_layer = probe_layer_;
  const bool was_training = model->is_training();
  model->eval();
  torch::NoGradGuard no_grad;

  // Every term of the objective set, with zero sums, so every rank reduces the same layout.
  std::vector<std::string> names;
  for (const data::Task task : {data::Task::kMono, data::Task::kPara}) {
    for (const auto& name : objectives_.term_names(task)) names.push_back(name);
  }
  std::map<std::string, std::vector<torch::Tensor>> sums;  // name -> loss, count, statistics...
  {
    ForkedRng fork(device);
    for (size_t i = 0; i < batches_.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(comm.world_size())) != comm.rank()) continue;
      fork.seed(seed_ + i);  // the same replacements whichever rank evaluates the micro-batch
      const auto inputs = model::ModelInputs::from(batches_[i]).to(device);
      std::vector<objectives::Term> terms;
      {
        AutocastScope autocast(device, bf16);
        terms = objectives_.compute(model->forward(inputs), batches_[i].task);
      }
      for (const auto& term : terms) {
        std::vector<torch::Tensor> values{term.loss_sum.to(torch::kFloat64),
                                          term.count.to(torch::kFloat64)};
        for (const auto& key : objectives::statistic_names(term.name)) {
          values.push_back(term.statistics.at(key).to(torch::kFloat64));
        }
        auto& acc = sums[term.name];
        if (acc.empty()) {
          acc = values;
        } else {
          for (size_t v = 0; v < values.size(); ++v) acc[v] = acc[v] + values[v];
        }
      }
    }
  }
  std::vector<torch::Tensor> flat;
  for (const auto& name : names) {
    const size_t width = 2 + objectives::statistic_names(name).size();
    const auto it = sums.find(name);
    for (size_t v = 0; v < width; ++v) {
      flat.push_back(it == sums.end()
                         ? torch::zeros({1}, torch::TensorOptions(torch::kFloat64).device(device))
                         : it->second[v].reshape({1}));
    }
  }
  std::vector<torch::Tensor> reduced{torch::cat(flat)};
  comm.all_reduce_sum(reduced);
  const auto host = reduced[0].cpu();
  int64_t at = 0;
  for (const auto& name : names) {
    objectives::Term term;
    term.name = name;
    term.loss_sum = host[at++];
    term.count = host[at++].to(torch::kInt64);
    for (const auto& key : objectives::statistic_names(name)) {
      term.statistics[key] = host[at++].to(torch::kInt64);
    }
    result.terms[name] = objectives::summarize(term);
  }

  if (comm.rank() == 0 && !probe_.empty()) {
    eval::EmbeddingOptions options;
    options.layers = {probe_layer_};
    options.pad_id = pad_;
    options.device = device;
    AutocastScope autocast(device, bf16);
    for (const auto& pair : probe_) {
      const auto a = eval::sentence_embeddings(model->discriminator, pair.a, options)[0];
      const auto b = eval::sentence_embeddings(model->discriminator, pair.b, options)[0];
      const auto accuracy = eval::retrieval_accuracy(a, b);
      result.retrieval[pair.name] = accuracy;
      result.retrieval_mean.a_to_b += accuracy.a_to_b / static_cast<double>(probe_.size());
      result.retrieval_mean.b_to_a += accuracy.b_to_a / static_cast<double>(probe_.size());
      result.retrieval_mean.mean += accuracy.mean / static_cast<double>(probe_.size());
    }
  }
  model->train(was_training);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace xlme::train
