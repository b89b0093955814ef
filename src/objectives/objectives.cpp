#include "xlme/objectives/objectives.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"
#include "xlme/data/batch.h"
#include "xlme/ops/masked_lm.h"

#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

namespace xlme::objectives {

Term generator_term(const std::string& name, const torch::Tensor& logits,
                    const torch::Tensor& targets) {
  const auto lm = ops::masked_lm(logits, targets);
  return generator_term(name, lm.loss_sum, lm.correct, targets);
}

Term generator_term(const std::string& name, const torch::Tensor& loss_sum,
                    const torch::Tensor& correct, const torch::Tensor& targets) {
  Term term;
  term.name = name;
  term.count = targets.ge(0).sum();  // ignored (padding) rows have negative targets
  term.loss_sum = loss_sum;
  term.statistics["correct"] = correct;
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

namespace {

// a: [B, T, width] -> [B, R, T, T] float32 (or wider): log softmax(A_r A_r^T / sqrt(d_r)) per
// relation head r, over the real keys.
torch::Tensor log_relations(const torch::Tensor& a, const torch::Tensor& padding,
                            int64_t relation_heads) {
  const int64_t batch = a.size(0), length = a.size(1), width = a.size(2);
  XLME_CHECK(width % relation_heads == 0,
             "distill.relation_heads ({}) must divide the width of the projections ({})",
             relation_heads, width);
  const int64_t d = width / relation_heads;
  const auto dtype = a.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto heads = a.to(dtype).view({batch, length, relation_heads, d}).transpose(1, 2);
  // Under bf16 autocast the product runs in bf16, as the attention's own scores do; the rest in
  // float32.
  auto scores =
      torch::matmul(heads, heads.transpose(-1, -2)).to(dtype) / std::sqrt(static_cast<double>(d));
  // A finite fill: a padded key gets probability 0 exactly and its KL summand 0 * finite, where
  // -inf would make it 0 * (-inf - -inf) = NaN.
  scores = scores.masked_fill(padding.view({batch, 1, 1, length}), -1e9);
  return torch::log_softmax(scores, -1);
}

}  // namespace

torch::Tensor relation_kl_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                              const torch::Tensor& padding, int64_t relation_heads) {
  XLME_CHECK(student.dim() == 3 && teacher.dim() == 3 &&
                 student.sizes().slice(0, 2).equals(teacher.sizes().slice(0, 2)),
             "relations need [B, T, width] projections of the same B and T, got [{}] and [{}]",
             fmt::join(student.sizes(), ", "), fmt::join(teacher.sizes(), ", "));
  const auto log_student = log_relations(student, padding, relation_heads);  // [B, R, T, T]
  const auto log_teacher = log_relations(teacher.detach(), padding, relation_heads);
  const auto kl = (log_teacher.exp() * (log_teacher - log_student)).sum(-1);  // [B, R, T]
  const auto real = padding.logical_not().to(kl.scalar_type()).unsqueeze(1);  // [B, 1, T]
  return (kl * real).sum() / static_cast<double>(relation_heads);
}

torch::Tensor hidden_cosine_sum(const torch::Tensor& student, const torch::Tensor& teacher,
                                const torch::Tensor& padding) {
  XLME_CHECK(student.sizes() == teacher.sizes(),
             "distill.hidden_cosine compares hidden states of equal widths, got [{}] and [{}]",
             fmt::join(student.sizes(), ", "), fmt::join(teacher.sizes(), ", "));
  const auto dtype = student.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const auto cosine = torch::cosine_similarity(student.to(dtype), teacher.detach().to(dtype), -1);
  return ((1 - cosine) * padding.logical_not().to(dtype)).sum();
}

namespace {

// VECO's terms: which side of the pair (x or y) they predict; 0 for the other terms.
char pair_side(const std::string& name) {
  for (const char* prefix : {"mlm_", "tlm_"}) {
    if (name.rfind(prefix, 0) == 0 && name.size() >= 5) return name[4];
  }
  return 0;
}

// The masked tokens of VECO's sides x and y (data::split_pair): x holds a row's positions before
// its first </s>, y the rest, and the frame's special tokens are never masked.
std::pair<int64_t, int64_t> pair_side_counts(const data::Batch& batch) {
  const int64_t eos = data::SpecialIds{}.eos;  // the layout's <s>, <pad> and </s> are fixed
  const auto in_x = batch.labels.eq(eos).cumsum(1).eq(0);
  const auto x = batch.masked.logical_and(in_x).sum().item<int64_t>();
  return {x, batch.masked.sum().item<int64_t>() - x};
}

}  // namespace

bool is_generator_term(const std::string& name) {
  return name == "mlm" || name == "tlm" || pair_side(name) != 0;
}

bool is_distillation_term(const std::string& name) {
  return name == "qq_kl" || name == "kk_kl" || name == "vv_kl" || name == "hidden_cos";
}

int64_t term_count(const std::string& name, const data::Batch& batch) {
  if (const char side = pair_side(name)) {
    const auto [x, y] = pair_side_counts(batch);
    return side == 'x' ? x : y;
  }
  return is_generator_term(name) ? batch.masked.sum().item<int64_t>()
                                 : batch.padding.logical_not().sum().item<int64_t>();
}

std::vector<std::string> statistic_names(const std::string& name) {
  if (is_distillation_term(name)) return {};
  if (is_generator_term(name)) return {"correct"};
  return {"correct", "predicted_positive", "replaced", "true_positive"};
}

Objectives::Objectives(const config::ObjectivesConfig& config, const config::DistillConfig& distill)
    : set_(&objective_set(config.set)),
      rtd_weight_(config.rtd_weight),
      relation_heads_(distill.relation_heads),
      hidden_cosine_(distill.hidden_cosine) {}

std::vector<std::string> Objectives::term_names(data::Task task) const {
  if (task != data::Task::kMono) return set_->translation_pair_terms();
  auto names = set_->monolingual_terms();
  if (set_->distillation && hidden_cosine_ > 0) names.push_back("hidden_cos");
  return names;
}

std::vector<std::string> Objectives::term_names() const {
  auto names = term_names(data::Task::kMono);
  for (auto& name : term_names(data::Task::kPara)) names.push_back(std::move(name));
  return names;
}

double Objectives::weight(const std::string& name) const {
  if (name == "hidden_cos") return hidden_cosine_;
  if (is_distillation_term(name)) return 1.0 / 3.0;
  return is_generator_term(name) ? 1.0 : rtd_weight_;
}

std::vector<double> Objectives::counts(const data::Batch& batch) const {
  const auto own = term_names(batch.task);
  std::optional<std::pair<int64_t, int64_t>> sides;  // VECO's, counted once per micro-batch
  std::vector<double> out;
  for (const auto& name : term_names()) {
    const bool counted = std::find(own.begin(), own.end(), name) != own.end();
    const char side = pair_side(name);
    int64_t count = 0;  // the other task's terms
    if (counted && side == 0) count = term_count(name, batch);
    if (counted && side != 0) {
      if (!sides) sides = pair_side_counts(batch);
      count = side == 'x' ? sides->first : sides->second;
    }
    out.push_back(static_cast<double>(count));
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

std::vector<Term> Objectives::distillation_terms(const model::ModelOutput& output) const {
  XLME_CHECK(output.student_attention.query.defined() && output.teacher_attention.query.defined(),
             "objectives.set={} distills a teacher, but the model's output has no attention "
             "projections; build the student with a teacher (train::build_model)",
             set_->name);
  const auto real_tokens = output.padding.logical_not().sum();
  const auto& s = output.student_attention;
  const auto& t = output.teacher_attention;
  std::vector<Term> terms;
  auto add = [&](const char* name, torch::Tensor loss_sum) {
    Term term;
    term.name = name;
    term.weight = weight(name);
    term.loss_sum = std::move(loss_sum);
    term.count = real_tokens;
    terms.push_back(std::move(term));
  };
  add("qq_kl", relation_kl_sum(s.query, t.query, output.padding, relation_heads_));
  add("kk_kl", relation_kl_sum(s.key, t.key, output.padding, relation_heads_));
  add("vv_kl", relation_kl_sum(s.value, t.value, output.padding, relation_heads_));
  if (hidden_cosine_ > 0) {
    add("hidden_cos",
        hidden_cosine_sum(output.student_hidden, output.teacher_hidden, output.padding));
  }
  return terms;
}

std::vector<Term> Objectives::compute(const model::ModelOutput& output, data::Task task) const {
  if (set_->distillation) return distillation_terms(output);
  std::vector<Term> terms;
  if (set_->cross_attention) {
    const auto names = term_names(task);
    XLME_CHECK(output.pair_predictions.size() == names.size(),
               "objectives.set={} needs the MLM head on both sides of each pair, with and without "
               "cross-attention ({} predictions), but the model gave {}; build it with "
               "model.cross_attention=true",
               set_->name, names.size(), output.pair_predictions.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& p = output.pair_predictions[i];
      terms.push_back(generator_term(names[i], p.logits, p.targets));
    }
    return terms;
  }
  for (const auto& name : term_names(task)) {
    if (is_generator_term(name)) {
      terms.push_back(
          output.generator_loss_sum.defined()
              ? generator_term(name, output.generator_loss_sum, output.generator_correct,
                               output.generator_targets)
              : generator_term(name, output.generator_logits, output.generator_targets));
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
  if (!reduced.statistics.count("correct")) return out;  // distillation terms
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
