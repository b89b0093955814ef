// The losses of XLM-E and its baselines: L = L_MLM + L_TLM + lambda * (L_MRTD + L_TRTD)
// (docs/ARCHITECTURE.md#loss). Each term of a micro-batch is returned as a loss *sum*, a count and
// statistic sums, all tensors on the model's device (no host synchronization), so that the
// trainer can normalize by the counts summed over every micro-batch and rank of an optimizer step.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/model/electra.h"
#include "xlme/objectives/objective_set.h"

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace xlme::objectives {

// One term of L on one micro-batch.
struct Term {
  std::string name;        // mlm, tlm (generator); mrtd, trtd (discriminator)
  double weight = 1.0;     // 1 for generator terms, lambda (objectives.rtd_weight) for RTD terms
  torch::Tensor loss_sum;  // []: summed per-token loss (differentiable)
  torch::Tensor count;     // [] int64: tokens in the sum (masked positions / real tokens)
  // [] int64 sums. Generator terms: correct. Discriminator terms: correct, true_positive
  // (predicted and actually replaced), predicted_positive, replaced.
  std::map<std::string, torch::Tensor> statistics;
};

// Generator term: cross-entropy over the masked positions.
// logits: [N, V]; targets: [N] int64.
Term generator_term(const std::string& name, const torch::Tensor& logits,
                    const torch::Tensor& targets);

// Discriminator term: binary cross-entropy with logits over the real (non-pad) tokens.
// logits: [B, T]; replaced, padding: [B, T] bool.
Term discriminator_term(const std::string& name, double weight, const torch::Tensor& logits,
                        const torch::Tensor& replaced, const torch::Tensor& padding);

// True for the generator terms (mlm, tlm), normalized by masked positions; false for the
// discriminator terms (mrtd, trtd), normalized by real tokens.
bool is_generator_term(const std::string& name);

// The count term `name` is normalized by in `batch` (masked positions or real tokens), known from
// the batch before any forward pass: the Term::count that generator_term or discriminator_term
// reports for it. Reads the host batch.
int64_t term_count(const std::string& name, const data::Batch& batch);

// The keys of Term::statistics for term `name`, in a fixed order (for flat all-reduces).
std::vector<std::string> statistic_names(const std::string& name);

// The terms an objective set (objectives.set, a row of objective_sets()) computes for each task.
class Objectives {
 public:
  explicit Objectives(const config::ObjectivesConfig& config);

  // Names of `task`'s terms; empty when the set does not train on that task (xlme-mono and mlm
  // use no translation pairs).
  std::vector<std::string> term_names(data::Task task) const;
  // Every term of the set: term_names(kMono), then term_names(kPara).
  std::vector<std::string> term_names() const;
  // The weight of term `name` in L: 1 for generator terms, lambda (objectives.rtd_weight) for the
  // discriminator terms.
  double weight(const std::string& name) const;

  // Per term of term_names(), the count it is normalized by in `batch` (term_count; 0 for the
  // terms of the other task). Reads the host batch.
  std::vector<double> counts(const data::Batch& batch) const;
  // The normalizers weighted_loss takes, from `counts` ([n] float64, n >= term_names().size():
  // the leading entries are counts() summed over every micro-batch and rank of the step). A term
  // with no token anywhere (e.g. nothing masked) is divided by 1: it contributes 0, not 0 / 0.
  std::map<std::string, torch::Tensor> normalizers(const torch::Tensor& counts) const;

  // The terms of one micro-batch of `task` from the model's output.
  std::vector<Term> compute(const model::ModelOutput& output, data::Task task) const;

 private:
  const ObjectiveSet* set_;
  double rtd_weight_;
};

// The differentiable loss of one micro-batch: sum over its terms of
// weight * loss_sum / normalizers[name], where a normalizer is the term's count summed over all
// micro-batches and ranks of the optimizer step ([] tensor). Back-propagating each micro-batch's
// value accumulates exactly the gradient of the step's normalized L.
torch::Tensor weighted_loss(const std::vector<Term>& terms,
                            const std::map<std::string, torch::Tensor>& normalizers);

// Loss and statistics as numbers, from a term whose sums were reduced over the step: loss,
// accuracy; for discriminator terms also precision, recall and f1 on replaced tokens and
// replaced_fraction. Reads tensors to the host: call once per log line, not per micro-batch.
std::map<std::string, double> summarize(const Term& reduced);

}  // namespace xlme::objectives
