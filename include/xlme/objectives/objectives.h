// The losses of XLM-E and its baselines: L = L_MLM + L_TLM + lambda * (L_MRTD + L_TRTD)
// (docs/ARCHITECTURE.md#loss), and of distillation (docs/pretraining.md#distillation). Each term of
// a micro-batch is returned as a loss *sum*, a count and statistic sums, all tensors on the model's
// device (no host synchronization), so that the trainer can normalize by the counts summed over
// every micro-batch and rank of an optimizer step.
#pragma once

#include "xlme/config/config.h"
#include "xlme/config/objective_set.h"
#include "xlme/data/batch.h"
#include "xlme/model/electra.h"

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace xlme::objectives {

// One term of L on one micro-batch.
struct Term {
  // mlm, tlm (generator); mrtd, trtd (discriminator); qq_kl, kk_kl, vv_kl, hidden_cos
  // (distillation); mlm_x, mlm_xy, mlm_y, mlm_yx, tlm_x, tlm_xy, tlm_y, tlm_yx (VECO)
  std::string name;
  // 1 for generator terms, lambda (objectives.rtd_weight) for RTD terms, 1/3 for each relation
  // term, distill.hidden_cosine for hidden_cos
  double weight = 1.0;
  torch::Tensor loss_sum;  // []: summed per-token loss (differentiable)
  torch::Tensor count;     // [] int64: tokens in the sum (masked positions / real tokens)
  // [] int64 sums. Generator terms: correct. Discriminator terms: correct, true_positive
  // (predicted and actually replaced), predicted_positive, replaced. Distillation terms: none.
  std::map<std::string, torch::Tensor> statistics;
};

// Generator term: cross-entropy over the masked positions (ops::masked_lm).
// logits: [N, V]; targets: [N] int64 (a negative target, model::kIgnoredTarget, is a padding row
// that counts nowhere).
Term generator_term(const std::string& name, const torch::Tensor& logits,
                    const torch::Tensor& targets);
// The same from a loss and a correct count the model already computed (ModelOutput's
// generator_loss_sum, generator_correct over the rows of `targets`).
Term generator_term(const std::string& name, const torch::Tensor& loss_sum,
                    const torch::Tensor& correct, const torch::Tensor& targets);

// Discriminator term: binary cross-entropy with logits over the real (non-pad) tokens.
// logits: [B, T]; replaced, padding: [B, T] bool.
Term discriminator_term(const std::string& name, double weight, const torch::Tensor& logits,
                        const torch::Tensor& replaced, const torch::Tensor& padding);

// MiniLMv2's relation loss of one relation (Q-Q, K-K or V-V), as a loss sum over the real query
// tokens: each of `student` and `teacher` ([B, T, width], heads concatenated; the widths may
// differ) is split into `relation_heads` heads A_r of width d_r = width / relation_heads, whose
// relation is softmax(A_r A_r^T / sqrt(d_r)) over the real keys; the sum over the real queries of
// KL(teacher || student), averaged over the relation heads. Computed in float32 (float64 input in
// float64; under bf16 autocast the score product in bf16); differentiable w.r.t. `student`.
// padding: [B, T] bool -> [].
torch::Tensor relation_kl_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                              const torch::Tensor& padding, int64_t relation_heads);

// DistilBERT's cosine loss as a sum over the real tokens of 1 - cos(student, teacher) ([B, T, H]
// each); padding: [B, T] bool -> [].
torch::Tensor hidden_cosine_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                                const torch::Tensor& padding);

// True for the generator terms (mlm, tlm, and VECO's mlm_* and tlm_*), normalized by masked
// positions; false for the discriminator terms (mrtd, trtd) and the distillation terms, normalized
// by real tokens.
bool is_generator_term(const std::string& name);

// True for the distillation terms (qq_kl, kk_kl, vv_kl, hidden_cos), which have no statistics.
bool is_distillation_term(const std::string& name);

// The count term `name` is normalized by in `batch` (masked positions or real tokens; VECO's terms:
// the masked positions of their side of the pair), known from the batch before any forward pass:
// the Term::count that generator_term or discriminator_term reports for it. Reads the host batch.
int64_t term_count(const std::string& name, const data::Batch& batch);

// The keys of Term::statistics for term `name`, in a fixed order (for flat all-reduces).
std::vector<std::string> statistic_names(const std::string& name);

// The terms an objective set (objectives.set, a row of objective_sets()) computes for each task.
class Objectives {
 public:
  // `distill`: the relation heads and the hidden-state cosine weight of objectives.set=distill.
  explicit Objectives(const config::ObjectivesConfig& config,
                      const config::DistillConfig& distill = {});

  // Names of `task`'s terms; empty when the set does not train on that task (xlme-mono and mlm
  // use no translation pairs). Distillation adds hidden_cos when distill.hidden_cosine > 0.
  std::vector<std::string> term_names(data::Task task) const;
  // Every term of the set: term_names(kMono), then term_names(kPara).
  std::vector<std::string> term_names() const;
  // The weight of term `name` in L: 1 for generator terms, lambda (objectives.rtd_weight) for the
  // discriminator terms, 1/3 for each relation term (their mean), distill.hidden_cosine for
  // hidden_cos.
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
  std::vector<Term> distillation_terms(const model::ModelOutput& output) const;

  const ObjectiveSet* set_;
  double rtd_weight_;
  int64_t relation_heads_;
  double hidden_cosine_;
};

// The differentiable loss of one micro-batch: sum over its terms of
// weight * loss_sum / normalizers[name], where a normalizer is the term's count summed over all
// micro-batches and ranks of the optimizer step ([] tensor). Back-propagating each micro-batch's
// value accumulates exactly the gradient of the step's normalized L.
torch::Tensor weighted_loss(const std::vector<Term>& terms,
                            const std::map<std::string, torch::Tensor>& normalizers);

// Loss and statistics as numbers, from a term whose sums were reduced over the step: loss,
// accuracy (not for distillation terms); for discriminator terms also precision, recall and f1 on
// replaced tokens and replaced_fraction. Reads tensors to the host: call once per log line, not per
// micro-batch.
std::map<std::string, double> summarize(const Term& reduced);

}  // namespace xlme::objectives
