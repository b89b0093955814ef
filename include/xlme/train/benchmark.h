// xlme-pretrain --benchmark N: the speed of the training step alone, on synthetic batches.
#pragma once

#include "xlme/config/config.h"

#include <cstdint>
#include <string>

namespace xlme::train {

// Runs 2 warm-up steps and then `steps` optimizer steps of the configured model and objectives on
// synthetic batches of data.mono.max_len-token sequences filling train.micro_batch_tokens, and
// returns one JSON line: tokens/s, ms per step and its split into data / forward / backward /
// communication / optimizer, the shapes, the parameter count, the precision, the model FLOPs per
// token, MFU (GPU; null on the CPU) and the peak memory (CPU: peak RSS; CUDA: peak allocated).
// With a `profile_path`, `steps` more steps then run under LibTorch's profiler: the time per
// operator (self and total, per step) is written to that file and its top rows are logged.
std::string run_benchmark(const config::Config& config, int64_t steps,
                          const std::string& profile_path = "");

}  // namespace xlme::train
