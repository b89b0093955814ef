// The export folder's format (xlme-export writes it, load_pretrained (pretrained.h) and
// scripts/xlme_reference.py read it):
//   model.safetensors  discriminator + shared embeddings + RTD head (+ generator on request)
//   config.json        every architectural field, the vocabulary, the format and xlme versions,
//                      spm.model's size and CRC32
//   spm.model          the SentencePiece model
//   README.md          a short model card
//   .xlme-export       marker: xlme-export wrote this folder (only such a folder is replaced)
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/special_ids.h"

#include <cstdint>
#include <string>

namespace xlme::checkpoint {

constexpr const char* kExportWeightsFile = "model.safetensors";
constexpr const char* kExportConfigFile = "config.json";
constexpr const char* kExportTokenizerFile = "spm.model";
constexpr const char* kExportReadmeFile = "README.md";
constexpr const char* kExportMarkerFile = ".xlme-export";
constexpr const char* kExportFormat = "xlme-export";
constexpr int kExportFormatVersion = 1;

// What config.json holds.
struct ExportedConfig {
  config::ModelConfig model;  // vocab_size resolved; generator sizes resolved (never 0)
  std::string objective_set = "xlme";
  std::string vocab_layout = "own";  // data.vocab_layout of the run
  data::SpecialIds special_ids;
  std::string dtype = "float32";  // of the tensors in model.safetensors: float32 or bfloat16
  bool rtd_head = true;           // discriminator_head.* in the weights
  bool generator = false;         // generator.* + generator_head.* (or mlm_head.*) in the weights
  int64_t step = 0;
  int64_t tokens_seen = 0;
  // spm.model's size and CRC32 (8 lowercase hex digits), config.json's "spm_model": a
  // SentencePiece model swapped for another is found on load. Empty in exports made before the
  // record (not checked).
  int64_t tokenizer_bytes = 0;
  std::string tokenizer_crc32;
};

// Pretty-printed JSON with "format", "format_version" and "xlme_version" first.
std::string to_json(const ExportedConfig& exported);

// Parses config.json (`path` names it in errors): a missing key, a wrong type, another format or
// a newer format version is an xlme::Error naming the file and the key.
ExportedConfig parse_exported_config(const std::string& text, const std::string& path);

// Fills `exported`'s tokenizer record from the SentencePiece model `tokenizer` (the export's copy).
void record_tokenizer(ExportedConfig& exported, const std::string& tokenizer);

// Throws naming both files when `tokenizer` is not the SentencePiece model that `exported` (read
// from `config_path`) records; nothing is checked when it records none.
void check_tokenizer(const ExportedConfig& exported, const std::string& tokenizer,
                     const std::string& config_path);

}  // namespace xlme::checkpoint
