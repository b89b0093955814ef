// The sums behind every reported loss and statistic: each term's loss sum, count and statistic
// sums, added over micro-batches, ranks and steps, and turned into numbers only at the end, so
// that a mean is sum / count over all of its tokens (docs/ARCHITECTURE.md#model). Training and
// validation both add, all-reduce and summarize their terms here.
#pragma once

#include "xlme/objectives/objectives.h"

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace xlme::objectives {

// Per term ("mlm", "mrtd", ...): summarize() of its sums (loss, accuracy, ...).
using TermSummaries = std::map<std::string, std::map<std::string, double>>;

// The sums of an objective set's terms.
class TermSums {
 public:
  TermSums() = default;  // no terms: add(TermSums) takes over the other's
  // Zero sums of every term of `objectives`, each with its weight in L.
  explicit TermSums(const Objectives& objectives);

  // Adds one micro-batch's terms, detached and in float64 on their device (no host
  // synchronization). Each term must be one of the sums' terms.
  void add(const std::vector<Term>& terms);
  // Adds other sums (e.g. the steps of a log interval); terms not here yet are taken over.
  void add(const TermSums& other);

  // [flat_size()] float64 on `device`: per term in name order, its loss sum, count and
  // statistic_names() sums; zeros for a term nothing was added to, so that every rank lays out
  // the same tensor for the all-reduce.
  torch::Tensor flatten(const torch::Device& device) const;
  int64_t flat_size() const;
  // The sums of the same terms laid out in `flat` as flatten() lays them out (e.g. after the
  // all-reduce): [flat_size()] float64 on the host. Counts and statistics become int64.
  TermSums unflatten(const torch::Tensor& flat) const;

  // summarize() of each term. Reads the sums to the host: call it once per log line.
  TermSummaries summary() const;
  // L: the sum over the terms of weight x mean loss, as the step optimized it.
  double total_loss() const;

  std::vector<std::string> names() const;  // the terms, in name order

 private:
  std::map<std::string, Term> terms_;  // by name; undefined tensors: nothing added yet
};

// " | mlm 7.12 acc 0.051 | mrtd 0.421 acc 0.800 f1 0.120": the terms' part of a log line.
std::string log_text(const TermSummaries& terms);

// The terms' fields of a metrics record, in order: per term loss/<term>, accuracy/<term> (not for
// the distillation terms) and, for the discriminator terms, f1/<term>.
std::vector<std::pair<std::string, double>> log_fields(const TermSummaries& terms);

}  // namespace xlme::objectives
