#include "xlme/objectives/term_sums.h"

#include "xlme/common/error.h"
#include "xlme/common/shape_text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace xlme::objectives {
namespace {

// a + b, where an undefined tensor (nothing added yet) counts as zero.
torch::Tensor sum_of(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return a + b;
}

}  // namespace

TermSums::TermSums(const Objectives& objectives) {
  for (const auto& name : objectives.term_names()) {
    Term& term = terms_[name];
    term.name = name;
    term.weight = objectives.weight(name);
  }
}

void TermSums::add(const std::vector<Term>& terms) {
  for (const auto& term : terms) {
    XLME_CHECK(terms_.count(term.name) > 0, "objective term {} is not one of the summed terms ({})",
               term.name, fmt::join(names(), ", "));
  }
  for (const auto& term : terms) {
    Term& acc = terms_.at(term.name);
    acc.loss_sum = sum_of(acc.loss_sum, term.loss_sum.detach().to(torch::kFloat64));
    acc.count = sum_of(acc.count, term.count.to(torch::kFloat64));
    for (const auto& [key, value] : term.statistics) {
      acc.statistics[key] = sum_of(acc.statistics[key], value.to(torch::kFloat64));
    }
  }
}

void TermSums::add(const TermSums& other) {
  for (const auto& [name, term] : other.terms_) {
    auto [it, fresh] = terms_.try_emplace(name, term);
    if (fresh) continue;
    Term& acc = it->second;
    acc.loss_sum = sum_of(acc.loss_sum, term.loss_sum);
    acc.count = sum_of(acc.count, term.count);
    for (const auto& [key, value] : term.statistics) {
      acc.statistics[key] = sum_of(acc.statistics[key], value);
    }
  }
}

torch::Tensor TermSums::flatten(const torch::Device& device) const {
  const auto options = torch::TensorOptions(torch::kFloat64).device(device);
  auto value = [&](const torch::Tensor& sum) {
    return sum.defined() ? sum.to(options).reshape({1}) : torch::zeros({1}, options);
  };
  std::vector<torch::Tensor> flat;
  for (const auto& [name, term] : terms_) {
    flat.push_back(value(term.loss_sum));
    flat.push_back(value(term.count));
    for (const auto& key : statistic_names(name)) {
      const auto it = term.statistics.find(key);
      flat.push_back(value(it == term.statistics.end() ? torch::Tensor() : it->second));
    }
  }
  return flat.empty() ? torch::zeros({0}, options) : torch::cat(flat);
}

int64_t TermSums::flat_size() const {
  int64_t n = 0;
  for (const auto& [name, term] : terms_) {
    n += 2 + static_cast<int64_t>(statistic_names(name).size());
  }
  return n;
}

TermSums TermSums::unflatten(const torch::Tensor& flat) const {
  XLME_CHECK(flat.dim() == 1 && flat.size(0) == flat_size(),
             "term sums: expected [{}] values laid out by flatten() for the terms {}, got a tensor "
             "of shape {}",
             flat_size(), fmt::join(names(), ", "), shape_text(flat.sizes()));
  TermSums out;
  int64_t at = 0;
  for (const auto& [name, term] : terms_) {
    Term& reduced = out.terms_[name];
    reduced.name = name;
    reduced.weight = term.weight;
    reduced.loss_sum = flat[at++];
    reduced.count = flat[at++].to(torch::kInt64);
    for (const auto& key : statistic_names(name)) {
      reduced.statistics[key] = flat[at++].to(torch::kInt64);
    }
  }
  return out;
}

TermSummaries TermSums::summary() const {
  // Through the flat layout: a term nothing was added to reads as zeros, and the sums on the host.
  const TermSums host = unflatten(flatten(torch::kCPU));
  TermSummaries out;
  for (const auto& [name, term] : host.terms_) out[name] = summarize(term);
  return out;
}

double TermSums::total_loss() const {
  double total = 0;
  for (const auto& [name, s] : summary()) total += terms_.at(name).weight * s.at("loss");
  return total;
}

std::vector<std::string> TermSums::names() const {
  std::vector<std::string> names;
  for (const auto& [name, term] : terms_) names.push_back(name);
  return names;
}

std::string log_text(const TermSummaries& terms) {
  std::string text;
  for (const auto& [name, s] : terms) {
    text += fmt::format(" | {} {:.4g}", name, s.at("loss"));
    if (s.count("accuracy")) text += fmt::format(" acc {:.3f}", s.at("accuracy"));
    if (s.count("f1")) text += fmt::format(" f1 {:.3f}", s.at("f1"));
  }
  return text;
}

std::vector<std::pair<std::string, double>> log_fields(const TermSummaries& terms) {
  std::vector<std::pair<std::string, double>> fields;
  for (const auto& [name, s] : terms) {
    fields.emplace_back("loss/" + name, s.at("loss"));
    if (s.count("accuracy")) fields.emplace_back("accuracy/" + name, s.at("accuracy"));
    if (s.count("f1")) fields.emplace_back("f1/" + name, s.at("f1"));
  }
  return fields;
}

}  // namespace xlme::objectives
