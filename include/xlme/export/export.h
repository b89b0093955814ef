// xlme-export's job: a pre-training checkpoint (or an export) -> a portable model folder
// (checkpoint/export_folder.h): model.safetensors, config.json, spm.model, README.md. The folder
// is written under a temporary name beside the target, synced, then renamed into place: a crash
// leaves the old folder or the new one. Optimizer state is never exported.
#pragma once

#include "xlme/config/config.h"

#include <cstdint>
#include <string>

namespace xlme::export_ {

struct ExportOptions {
  std::string checkpoint;          // a checkpoint folder or an export folder
  std::string out_dir;             // the folder to write
  bool with_generator = false;     // also the generator and its head
  std::string dtype = "fp32";      // fp32 or bf16 (floating-point weights only)
  bool force = false;              // replace a non-empty out_dir that xlme-export wrote
  std::string fallback_tokenizer;  // for a checkpoint without tokenizer.model (data.tokenizer)

  // export.* and data.tokenizer of a resolved config.
  static ExportOptions from_config(const config::Config& config);
};

struct ExportSummary {
  std::string out_dir;
  int64_t step = 0;
  int64_t tensors = 0;
  int64_t parameters = 0;     // elements over all exported tensors
  uint64_t weight_bytes = 0;  // size of model.safetensors
};

ExportSummary export_model(const ExportOptions& options);

}  // namespace xlme::export_
