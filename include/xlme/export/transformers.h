// The HuggingFace `transformers` side of an export folder
// (docs/export.md#loading-an-export-with-huggingface-transformers): config.json gains model_type,
// architectures, auto_map and torch_dtype; the remote code that auto_map names (scripts/hf/*.py and
// scripts/xlme_reference.py, built into xlme), tokenizer_config.json and tokenizer.json for
// AutoTokenizer are written beside it.
#pragma once

#include "xlme/checkpoint/export_folder.h"

#include <string>
#include <vector>

namespace xlme::export_ {

struct EmbeddedFile {
  const char* name;  // file name in the export folder, e.g. "modeling_xlme.py"
  const char* text;
};

// The fast tokenizer's file in an export folder (tokenizer_json.h).
inline constexpr const char* kTokenizerJsonFile = "tokenizer.json";

// scripts/hf/*.py and scripts/xlme_reference.py as they were when xlme was built (generated from
// the sources by CMakeLists.txt).
const std::vector<EmbeddedFile>& transformers_files();

// Extends `folder`/config.json (written from `exported`) with the transformers keys and writes the
// remote code and tokenizer_config.json into `folder`.
void write_transformers_files(const std::string& folder,
                              const checkpoint::ExportedConfig& exported);

}  // namespace xlme::export_
