// xlme-pretrain --comm-estimate: the gradient communication of one optimizer step on 8 and 64
// GPUs, from the bytes the trainer sends (docs/pretraining.md#scaling-to-64-gpus).
#pragma once

#include "xlme/config/config.h"

#include <cstdint>
#include <string>
#include <vector>

namespace xlme::train {

// One row of the estimate: `gpus` ranks (8 per node) summing `bytes` of gradients with a ring
// all-reduce, which sends and receives 2 (N - 1) / N of them per GPU over its slowest link.
struct CommEstimate {
  int gpus = 0;
  std::string link;             // the slowest link of the ring
  double link_bytes_per_s = 0;  // per GPU and direction
  double bytes_per_gpu = 0;     // 2 (N - 1) / N x the gradient bytes
  double seconds = 0;           // bytes_per_gpu / link_bytes_per_s
};

// The rows for `gradient_bytes` on each of `gpu_counts`: up to 8 GPUs one node, over NVLink 4
// (450 GB/s per direction per GPU, H100/H200 SXM); beyond, the ring crosses nodes over one
// 400 Gb/s InfiniBand NIC per GPU (50 GB/s per direction).
std::vector<CommEstimate> estimate_communication(double gradient_bytes,
                                                 const std::vector<int>& gpu_counts);

// The table xlme-pretrain --comm-estimate prints for the configured model: its trained
// parameters (counted from the config, as --print-model) as fp32 gradient bytes, the time per
// step at 8 and 64 GPUs, the share that dist.overlap can hide, and the AdamW state per GPU with
// and without train.zero=1.
std::string format_communication_estimate(const config::Config& config);

}  // namespace xlme::train
