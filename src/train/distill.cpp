#include "xlme/train/distill.h"

#include "xlme/checkpoint/pretrained.h"
#include "xlme/common/error.h"
#include "xlme/model/parameter_count.h"

#include <spdlog/spdlog.h>

#include <filesystem>

namespace xlme::train {

model::Teacher load_teacher(const config::Config& config) {
  const auto& d = config.distill;
  XLME_CHECK(!d.teacher.empty(),
             "objectives.set=distill needs distill.teacher: the run, checkpoint or export folder "
             "of the teacher (e.g. --set distill.teacher=runs/demo)");
  XLME_CHECK(std::filesystem::exists(d.teacher),
             "distill.teacher '{}' not found; give the run, checkpoint or export folder of the "
             "teacher (e.g. runs/demo after xlme-pretrain --config configs/pretrain/demo.yaml)",
             d.teacher);
  checkpoint::Pretrained p;
  try {
    p = checkpoint::load_pretrained_resolved(d.teacher);
  } catch (const Error& e) {
    XLME_FAIL("distill.teacher '{}': {}", d.teacher, e.what());
  }
  const auto& t = p.model;
  const auto& s = config.model;
  XLME_CHECK(t.vocab_size == s.vocab_size,
             "distill.teacher '{}' has a vocabulary of {} ids but the student (model.vocab_size, "
             "data.tokenizer) has {}; distill with the tokenizer the teacher was trained with",
             p.path, t.vocab_size, s.vocab_size);
  XLME_CHECK(d.teacher_layer != 0 && d.teacher_layer >= -t.layers && d.teacher_layer <= t.layers,
             "distill.teacher_layer is {}, but the teacher '{}' has {} layers: give 1..{} or "
             "-1..-{} (from the end)",
             d.teacher_layer, p.path, t.layers, t.layers, t.layers);
  XLME_CHECK(s.hidden_size % d.relation_heads == 0 && t.hidden_size % d.relation_heads == 0,
             "distill.relation_heads ({}) must divide both hidden sizes: the student's "
             "(model.hidden_size {}) and the teacher's ({} in '{}')",
             d.relation_heads, s.hidden_size, t.hidden_size, p.path);
  XLME_CHECK(d.hidden_cosine == 0 || s.hidden_size == t.hidden_size,
             "distill.hidden_cosine ({}) compares the last hidden states, which needs equal "
             "widths, but model.hidden_size is {} and the teacher's ({}) is {}; set "
             "distill.hidden_cosine=0",
             d.hidden_cosine, s.hidden_size, p.path, t.hidden_size);
  model::Teacher teacher;
  teacher.model = p.discriminator.ptr();
  teacher.encoder = p.discriminator->discriminator;
  teacher.layer = d.teacher_layer > 0 ? d.teacher_layer : t.layers + 1 + d.teacher_layer;
  teacher.hidden = d.hidden_cosine > 0;
  spdlog::info(
      "distillation teacher {} (step {}, objectives.set {}): {} layers x {} wide, {} heads, "
      "{} parameters frozen; relations of its layer {} ({} relation heads)",
      p.path, p.step, p.objective_set, t.layers, t.hidden_size, t.heads,
      teacher_parameter_count(teacher), teacher.layer, d.relation_heads);
  return teacher;
}

int64_t teacher_parameter_count(const model::Teacher& teacher) {
  int64_t n = 0;
  for (const auto& p : teacher.model->parameters()) n += p.numel();
  return n;
}

model::ElectraModel build_model(const config::Config& config) {
  const auto architecture = model::architecture_for(config.objectives.set);
  model::ElectraModel model{nullptr};
  try {
    model = model::ElectraModel(config.model, architecture);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    if (what.find("allocate") == std::string::npos &&
        dynamic_cast<const std::bad_alloc*>(&e) == nullptr) {
      throw;
    }
    const auto parameters =
        model::total_count(model::analytic_parameter_counts(config.model, architecture));
    XLME_FAIL(
        "cannot allocate the model: {} parameters ({:.1f} GiB in fp32) from model.vocab_size {}, "
        "model.hidden_size {}, model.layers {} (generator {}) do not fit in memory: {}; lower "
        "those keys (xlme-pretrain --print-model counts a config without allocating it)",
        parameters, static_cast<double>(parameters) * 4 / (1024.0 * 1024.0 * 1024.0),
        config.model.vocab_size, config.model.hidden_size, config.model.layers,
        config.model.generator.layers, what.substr(0, what.find('\n')));
  }
  if (model->architecture() == model::Architecture::kEncoder)
    model->set_teacher(load_teacher(config));
  return model;
}

}  // namespace xlme::train
