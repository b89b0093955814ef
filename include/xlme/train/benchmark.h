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
// With a `save_dir`, the time a step waits per checkpoint is added, twice each way, written into a
// fresh folder there (removed afterwards): saved while training waits (save_blocked_ms_sync), and
// copied to host memory and written in the background (save_blocked_ms_async), with the step
// run meanwhile (step_ms_during_async_save), the wait left after it (save_wait_ms_after_one_step),
// the checkpoint's size and the peak memory with the saves' host copy.
std::string run_benchmark(const config::Config& config, int64_t steps,
                          const std::string& profile_path = "", const std::string& save_dir = "");

}  // namespace xlme::train
