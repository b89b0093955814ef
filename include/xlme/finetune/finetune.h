// xlme-finetune's job (docs/ARCHITECTURE.md#fine-tuning): load the pre-trained discriminator
// strictly, then either fine-tune and evaluate a task over every seed (finetune/runner.h,
// finetune/tasks.h) or run a probe that trains nothing (finetune/probes.h); results.json,
// prediction files and a table of the main score.
#pragma once

#include "xlme/config/config.h"

#include <string>

namespace xlme::finetune {

// finetune.init as a folder load_pretrained reads: a run folder (holding checkpoints/) becomes
// its newest valid checkpoint; a checkpoint or export folder stays as it is.
std::string resolve_init(const std::string& init);

// Runs config.finetune.task; writes <run.out_dir>/results.json and predictions/. Returns the
// process exit code.
int run_finetune(const config::Config& config);

}  // namespace xlme::finetune
