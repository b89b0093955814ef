// Pre-trained weights for fine-tuning, evaluation and export, from either a pre-training
// checkpoint folder (<run>/checkpoints/step_<N>/) or an export folder (xlme-export), detected
// from the files present. Loading is strict (docs/export.md#loading-in-c-load_pretrained): a
// missing or unexpected weight, a shape that differs, or a vocabulary size / special id that
// disagrees between the weights, the config and the tokenizer is an error that names them.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/model/discriminator.h"
#include "xlme/model/electra.h"

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace xlme::checkpoint {

enum class PretrainedSource { kCheckpoint, kExport };

struct PretrainedOptions {
  // Also build the whole ELECTRA model (generator, heads) into Pretrained::electra; an export
  // without the generator is then an error.
  bool with_generator = false;
  // The SentencePiece model to use when a checkpoint holds none (a run without data.tokenizer);
  // empty: such a checkpoint loads without a tokenizer.
  std::string fallback_tokenizer;
  // VECO (objectives.set=veco): keep the cross-attention modules in the discriminator (plug-in);
  // false: leave them out (plug-out), so that the model is the plain self-attention encoder.
  // True with a model that has none is an error.
  bool cross_attention = false;
};

struct Pretrained {
  PretrainedSource source = PretrainedSource::kCheckpoint;
  std::string path;
  config::ModelConfig model;   // resolved: vocab_size is the tokenizer's and the weights'
  std::string objective_set;   // objectives.set of the run (xlme, xlme-mono, mlm, mlm+tlm)
  std::string tokenizer_path;  // the SentencePiece model; empty when the source has none
  // The same file as opened while the weights were read ("/proc/self/fd/N"): read the tokenizer
  // through it, as a live run may prune the checkpoint after it was loaded. Empty when none.
  std::string tokenizer_file;
  std::shared_ptr<const int> tokenizer_fd;  // keeps tokenizer_file open
  std::string vocab_layout;                 // data.vocab_layout: own or xlmr
  data::SpecialIds special_ids;             // equal to the tokenizer's (checked)
  int64_t step = 0;                         // optimizer steps of the pre-training
  int64_t tokens_seen = 0;                  // real tokens of the pre-training
  std::string dtype = "float32";            // of the stored weights (exports may be bfloat16)
  // Checkpoints only: the run's whole resolved config (config.yaml).
  std::optional<config::Config> run_config;
  // Weights loaded, fp32, CPU, in eval mode.
  model::DiscriminatorModel discriminator{nullptr};
  model::ElectraModel electra{nullptr};  // with_generator only
};

// `path` as a folder load_pretrained reads: a run folder (holding checkpoints/) becomes its newest
// valid checkpoint (newer damaged ones are skipped with a warning); a checkpoint or export folder
// stays as it is. A run folder without a valid checkpoint is an error naming it.
std::string resolve_pretrained_folder(const std::string& path);

// Which kind of folder `path` is; an xlme::Error says what is missing otherwise (and points from
// a run folder to its checkpoints).
PretrainedSource detect_pretrained_source(const std::string& path);

Pretrained load_pretrained(const std::string& path, const PretrainedOptions& options = {});

// load_pretrained of resolve_pretrained_folder(path); Pretrained::path is the folder read. When
// `path` is a run folder whose checkpoints change while one is chosen and read (its live run
// saves and prunes: train.keep_last), the newest one is chosen again, up to 20 times, so that
// reading a live run's folder does not fail because the run saves.
Pretrained load_pretrained_resolved(const std::string& path, const PretrainedOptions& options = {});

// Weights only the whole ELECTRA model has: generator.*, generator_head.*, mlm_head.*.
bool is_generator_weight(const std::string& name);

// VECO's cross-attention weights: *.cross_attention.* and *.cross_attention_norm.*.
bool is_cross_attention_weight(const std::string& name);

}  // namespace xlme::checkpoint
