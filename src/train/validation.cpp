#include "xlme/train/validation.h"

#include "xlme/common/error.h"
#include "xlme/common/precision.h"
#include "xlme/train/rng.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

namespace xlme::train {

Validator::Validator(const config::Config& config, const std::vector<data::HeldoutPair>& pairs,
                     const data::SpecialIds& special)
    : objectives_(config.objectives, config.distill),
      pad_(special.pad),
      seed_(config.run.seed * 0x5eed + 17) {
  probe_layer_ = config.train.probe_layer >= 0 ? config.train.probe_layer : config.model.layers / 2;
  data::BatchOptions options = data::BatchOptions::from_config(config, nullptr, 0, 1);
  options.ids = special;
  options.mono.enabled = !objectives_.term_names(data::Task::kMono).empty();
  options.para.enabled = !objectives_.term_names(data::Task::kPara).empty();
  batches_ = data::heldout_batches(pairs, options, seed_);
  // The unigram floors: per task, the share of its masked originals that the most frequent of
  // them makes up, and the entropy of their distribution.
  for (const data::Task task : {data::Task::kMono, data::Task::kPara}) {
    std::map<int64_t, int64_t> counts;
    int64_t total = 0;
    for (const auto& b : batches_) {
      if (b.task != task) continue;
      const auto targets = b.labels.masked_select(b.masked).contiguous();
      const int64_t* t = targets.data_ptr<int64_t>();
      for (int64_t i = 0; i < targets.numel(); ++i) ++counts[t[i]];
      total += targets.numel();
    }
    int64_t most = 0;
    double entropy = 0;
    for (const auto& [id, n] : counts) {
      most = std::max(most, n);
      const double p = static_cast<double>(n) / static_cast<double>(total);
      entropy -= p * std::log(p);
    }
    for (const auto& name : objectives_.term_names(task)) {
      if (objectives::is_generator_term(name) && total > 0) {
        unigram_accuracy_[name] = static_cast<double>(most) / static_cast<double>(total);
        unigram_loss_[name] = entropy;
      }
    }
  }
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

  objectives::TermSums sums(objectives_);
  {
    ForkedRng fork(device);
    for (size_t i = 0; i < batches_.size(); ++i) {
      if (static_cast<int>(i % static_cast<size_t>(comm.world_size())) != comm.rank()) continue;
      fork.seed(seed_ + i);  // the same replacements whichever rank evaluates the micro-batch
      const auto inputs = model->inputs(batches_[i]).to(device);
      std::vector<objectives::Term> terms;
      {
        AutocastScope autocast(device, bf16);
        terms = objectives_.compute(model->forward(inputs), batches_[i].task);
      }
      sums.add(terms);
    }
  }
  // Every rank lays out every term of the set (zeros for terms it saw nothing of).
  std::vector<torch::Tensor> reduced{sums.flatten(device)};
  comm.all_reduce_sum(reduced);
  result.terms = sums.unflatten(reduced[0].cpu()).summary();
  result.unigram_accuracy = unigram_accuracy_;
  result.unigram_loss = unigram_loss_;

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
