// What a pre-training run reports: every train.log_every steps (and at the first and the last) a
// log line and a metrics.jsonl record with the interval's term statistics and throughput
// (tokens/s, MFU, peak memory), and each validation's. The step loop hands it each step's record,
// as torchtitan's train() hands its MetricsProcessor.
#pragma once

#include "xlme/config/config.h"
#include "xlme/data/batch.h"
#include "xlme/objectives/term_sums.h"
#include "xlme/train/metrics.h"
#include "xlme/train/trainer.h"
#include "xlme/train/validation.h"

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace xlme::train {

class MetricsProcessor {
 public:
  // With `writes` (rank 0), appends to <run.out_dir>/metrics.jsonl after dropping what a stopped
  // run wrote after `resumed_step` (MetricsWriter), and its validation record at that step too
  // when `validates_at_start` (the run validates that step again).
  MetricsProcessor(const config::Config& config, const torch::Device& device, int world_size,
                   bool writes, int64_t resumed_step, bool validates_at_start);

  // Adds a finished step to the interval; at a log step logs its line and `source`'s language
  // table, writes its record (`tokens_seen`: the run's, this step included), and starts the next
  // interval.
  void log_step(const StepRecord& record, int64_t tokens_seen, const data::BatchSource& source);
  // Logs and writes `result`, and restarts the interval's clock: tokens/s is training's alone.
  void log_validation(const ValidationResult& result);

 private:
  int64_t log_every_;
  int64_t total_steps_;
  torch::Device device_;
  std::string device_name_;
  int world_size_;
  std::unique_ptr<MetricsWriter> writer_;  // rank 0 only
  // The interval since the last log line: its start, real tokens and model FLOPs (all ranks), and
  // its term sums, so that its accuracies and F1 are those of all its tokens, not its last step's.
  std::chrono::steady_clock::time_point start_;
  int64_t tokens_ = 0;
  double flops_ = 0;
  objectives::TermSums sums_;
};

}  // namespace xlme::train
