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

// Writes the export. Holds an exclusive lock on `<out_dir>.lock` (removed at the end) for its
// length, so that a second export of the same folder fails naming the first's pid, and first
// cleans the folders a killed export of `out_dir` left beside it.
ExportSummary export_model(const ExportOptions& options);

// Moves the finished export folder `written` to `out_dir`. What is at `out_dir` now is checked
// again (it may have changed since the export started): an empty folder, or with `force` an
// export folder xlme-export wrote, is moved aside and removed once the new one is in; anything
// else (a run moved there, a symbolic link) is left as it is, `written` is removed, and an
// xlme::Error names `out_dir` and what it holds.
void move_export_into_place(const std::string& written, const std::string& out_dir, bool force);

}  // namespace xlme::export_
