// The layout of xlme's pre-training folders, named once for the trainer that writes them and for
// every reader (resume, --init-from, load_pretrained, xlme-export, xlme-finetune):
//   <run.out_dir>/metrics.jsonl           one JSON record per logged step (train/metrics.h)
//   <run.out_dir>/checkpoints/step_<N>/   a checkpoint (manager.h), holding
//     manifest.yaml    every other file with its size and CRC32, written last
//     model.pt         the whole ELECTRA model (torch::serialize archive, archive.h)
//     optimizer.pt     the optimizer's state
//     rank<R>.pt       rank R's data reader position and random generator states
//     trainer.yaml     TrainerState
//     config.yaml      the run's resolved config
//     tokenizer.model  data.tokenizer's SentencePiece model (when the run has one)
#pragma once

#include <cstdint>
#include <string>

namespace xlme::checkpoint {

constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kCheckpointsFolder = "checkpoints";
constexpr const char* kManifestFile = "manifest.yaml";
constexpr const char* kModelFile = "model.pt";
constexpr const char* kOptimizerFile = "optimizer.pt";
constexpr const char* kTrainerStateFile = "trainer.yaml";
constexpr const char* kConfigFile = "config.yaml";
constexpr const char* kTokenizerFile = "tokenizer.model";

// "rank3.pt" for rank 3.
std::string rank_file(int rank);

// <run_dir>/checkpoints.
std::string checkpoints_folder(const std::string& run_dir);

// What a checkpoint's trainer.yaml records, every value within its range.
struct TrainerState {
  int64_t step = 0;
  int64_t tokens_seen = 0;
  int64_t skipped_steps = 0;
  int world_size = 1;
  // Tokens per optimizer step and task over all ranks; 0 in checkpoints from before it was
  // recorded (a resume then computes it from their config.yaml).
  int64_t tokens_per_step = 0;
};

// Reads trainer.yaml at `file` (a path from VerifiedFiles); a missing, malformed or out-of-range
// value is an error naming the file and the field.
TrainerState read_trainer_state(const std::string& file);

// Writes `state` to `file` atomically (write_file_atomic).
void write_trainer_state(const std::string& file, const TrainerState& state);

}  // namespace xlme::checkpoint
