#include "xlme/objectives/objectives.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"

#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>

namespace xlme::objectives {

Term generator_term(const std::string& name, const torch::Tensor& logits,
                    const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  Term term;
  term.name = name;
  term.loss_sum =
      F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  term.count = torch::full({}, targets.size(0), targets.options().dtype(torch::kInt64));
  term.statistics["correct"] = (logits.detach().argmax(1) == targets).sum();
  return term;
}

Term discriminator_term(const std::string& name, double weight, const torch::Tensor& logits,
                        const torch::Tensor& replaced, const torch::Tensor& padding) {
  namespace F = torch::nn::functional;
  Term term;
  term.name = name;
  term.weight = weight;
  const auto real = padding.logical_not();  // [B, T]
  // Padding is weighted out rather than indexed away: boolean indexing would sync the host.
  term.loss_sum = F::binary_cross_entropy_with_logits(logits, replaced.to(logits.scalar_type()),
                                                      F::BinaryCrossEntropyWithLogitsFuncOptions()
                                                          .weight(real.to(logits.scalar_type()))
                                                          .reduction(torch::kSum));
  term.count = real.sum();
  const auto predicted = logits.detach() > 0;
  const auto actual = replaced.logical_and(real);
  term.statistics["correct"] = predicted.eq(replaced).logical_and(real).sum();
  term.statistics["true_positive"] = predicted.logical_and(actual).sum();
  term.statistics["predicted_positive"] = predicted.logical_and(real).sum();
  term.statistics["replaced"] = actual.sum();
  return term;
}

bool is_generator_term(const std::string& name) {
  return name == "mlm" || name == "tlm";
}

int64_t term_count(const std::string& name, const data::Batch& batch) {
  return is_generator_term(name) ? batch.masked.sum().item<int64_t>()
                                 : batch.padding.logical_not().sum().item<int64_t>();
}

std::vector<std::string> statistic_names(const std::string& name) {
  if (is_generator_term(name)) return {"correct"};
  return {"correct", "predicted_positive", "replaced", "true_positive"};
}

Objectives::Objectives(const config::ObjectivesConfig& config)
    : set_(&objective_set(config.set)), rtd_weight_(config.rtd_weight) {}

std::vector<std::string> Objectives::term_names(data::Task task) const {
  return task == data::Task::kMono ? set_->monolingual_terms() : set_->translation_pair_terms();
}

std::vector<std::string> Objectives::term_names() const {
  auto names = set_->monolingual_terms();
  for (auto& name : set_->translation_pair_terms()) names.push_back(std::move(name));
  return names;
}

double Objectives::weight(const std::string& name) const {
  return is_generator_term(name) ? 1.0 : rtd_weight_;
}

std::vector<double> Objectives::counts(const data::Batch& batch) const {
  const auto own = term_names(batch.task);
  std::vector<double> out;
  for (const auto& name : term_names()) {
    const bool counted = std::find(own.begin(), own.end(), name) != own.end();
    out.push_back(counted ? static_cast<double>(term_count(name, batch)) : 0.0);
  }
  return out;
}

std::map<std::string, torch::Tensor> Objectives::normalizers(const torch::Tensor& counts) const {
  const auto names = term_names();
  XLME_CHECK(counts.dim() == 1 && counts.size(0) >= static_cast<int64_t>(names.size()),
             "normalizers need a count per objective term ({} terms), got a tensor of shape {}",
             names.size(), shape_text(counts.sizes()));
  std::map<std::string, torch::Tensor> out;
  for (std::size_t n = 0; n < names.size(); ++n) {
    out[names[n]] = counts[static_cast<int64_t>(n)].clamp_min(1.0).to(torch::kFloat32);
  }
  return out;
}

std::vector<Term> Objectives::compute(const model::ModelOutput& output, data::Task task) const {
  std::vector<Term> terms;
  for (const auto& name : term_names(task)) {
    if (is_generator_term(name)) {
      terms.push_back(generator_term(name, output.generator_logits, output.generator_targets));
    } else {
      XLME_CHECK(output.discriminator_logits.defined(),
                 "objective term {} needs the discriminator, but the model was built without a "
                 "generator; build it with the architecture of objectives.set={}",
                 name, set_->name);
      terms.push_back(discriminator_term(name, weight(name), output.discriminator_logits,
                                         output.replaced, output.padding));
    }
  }
  return terms;
}

torch::Tensor weighted_loss(const std::vector<Term>& terms,
                            const std::map<std::string, torch::Tensor>& normalizers) {
  XLME_CHECK(!terms.empty(), "weighted_loss needs at least one objective term");
  torch::Tensor loss;
  for (const auto& term : terms) {
    const auto it = normalizers.find(term.name);
    XLME_CHECK(it != normalizers.end(), "no normalizer for objective term {}", term.name);
    // clamp: a step without a single masked token contributes 0 instead of 0/0.
    const auto part =
        term.loss_sum * term.weight / it->second.clamp_min(1).to(term.loss_sum.dtype());
    loss = loss.defined() ? loss + part : part;
  }
  return loss;
}

std::map<std::string, double> summarize(const Term& reduced) {
  auto value = [](const torch::Tensor& t) { return t.to(torch::kDouble).item<double>(); };
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
  std::map<std::string, double> out;
  const double count = value(reduced.count);
  out["loss"] = ratio(value(reduced.loss_sum.detach()), count);
  out["accuracy"] = ratio(value(reduced.statistics.at("correct")), count);
  if (reduced.statistics.count("true_positive")) {
    const double tp = value(reduced.statistics.at("true_positive"));
    const double predicted = value(reduced.statistics.at("predicted_positive"));
    const double replaced = value(reduced.statistics.at("replaced"));
    const double precision = ratio(tp, predicted), recall = ratio(tp, replaced);
    out["precision"] = precision;
    out["recall"] = recall;
    out["f1"] = ratio(2 * precision * recall, precision + recall);
    out["replaced_fraction"] = ratio(replaced, count);
  }
  return out;
}

}  // namespace xlme::objectives
