// objectives.set=distill (docs/pretraining.md#distillation): the frozen teacher that distill.*
// names, and the model a pre-training run trains.
#pragma once

#include "xlme/config/config.h"
#include "xlme/model/electra.h"

#include <cstdint>

namespace xlme::train {

// The teacher of `config.distill` for the student that `config.model` describes (vocab_size
// resolved): load_pretrained of distill.teacher (a run folder's newest valid checkpoint, a
// checkpoint or an export folder), with distill.teacher_layer resolved (negative: from the end).
// Errors name the key: an empty or missing teacher, a layer outside the teacher, relation heads
// that do not divide both hidden sizes, hidden_cosine with different hidden sizes, a vocabulary
// other than the student's.
model::Teacher load_teacher(const config::Config& config);

// The teacher's parameter count (frozen: not trained, not saved).
int64_t teacher_parameter_count(const model::Teacher& teacher);

// The model that objectives.set trains, built from config.model at the current torch seed; a
// distillation student gets its teacher (load_teacher).
model::ElectraModel build_model(const config::Config& config);

}  // namespace xlme::train
