#include "xlme/config/objective_set.h"

#include "xlme/common/error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace xlme::objectives {

std::vector<std::string> ObjectiveSet::monolingual_terms() const {
  if (!monolingual) return {};
  if (distillation) return {"qq_kl", "kk_kl", "vv_kl"};
  if (cross_attention) return {"mlm_x", "mlm_xy", "mlm_y", "mlm_yx"};
  if (!discriminator) return {"mlm"};
  return {"mlm", "mrtd"};
}

std::vector<std::string> ObjectiveSet::translation_pair_terms() const {
  if (!translation_pairs) return {};
  if (cross_attention) return {"tlm_x", "tlm_xy", "tlm_y", "tlm_yx"};
  if (!discriminator) return {"tlm"};
  return {"tlm", "trtd"};
}

const std::vector<ObjectiveSet>& objective_sets() {
  static const std::vector<ObjectiveSet> sets = {
      // name, description, discriminator, monolingual, translation_pairs, distillation,
      // cross_attention
      {"xlme", "MLM+TLM+MRTD+TRTD", true, true, true, false, false},
      {"xlme-mono", "MLM+MRTD", true, true, false, false, false},
      {"mlm", "XLM-R-style MLM", false, true, false, false, false},
      {"mlm+tlm", "XLM-style MLM+TLM", false, true, true, false, false},
      {"distill", "MiniLMv2-style distillation of distill.teacher", false, true, false, true,
       false},
      {"veco", "VECO's cross-attention MLM (model.cross_attention=true)", false, true, true, false,
       true},
  };
  return sets;
}

const ObjectiveSet& objective_set(const std::string& name) {
  for (const auto& set : objective_sets()) {
    if (set.name == name) return set;
  }
  XLME_FAIL("unknown objectives.set '{}'; known sets: {}", name,
            fmt::join(objective_set_names(), ", "));
}

std::vector<std::string> objective_set_names() {
  std::vector<std::string> names;
  for (const auto& set : objective_sets()) names.push_back(set.name);
  return names;
}

const char* objective_set_help() {
  static const std::string help = [] {
    std::vector<std::string> parts;
    for (const auto& set : objective_sets()) parts.push_back(set.name + " = " + set.description);
    return fmt::format("{}", fmt::join(parts, "; "));
  }();
  return help.c_str();
}

}  // namespace xlme::objectives
