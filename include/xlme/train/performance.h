// What the log line and --benchmark report about the machine: peak memory, the model FLOPs of a
// trained token, and the device's peak for MFU (model FLOPs utilization, as in PaLM and llm.c).
#pragma once

#include "xlme/config/config.h"
#include "xlme/model/electra.h"

#include <torch/types.h>

#include <optional>
#include <string>

namespace xlme::train {

// Peak memory in MiB since the process started (CPU: peak resident set size from getrusage;
// CUDA: the caching allocator's peak of allocated bytes on `device`; a CPU-only build reports -1
// for a CUDA device).
double peak_memory_mib(const torch::Device& device);

// Model FLOPs of training on one real token of a sequence of `length` tokens: 3 x the forward
// pass (the backward pass costs about twice the forward), counting multiply-adds as 2 FLOPs:
//   per encoder (generator and discriminator, each with its own width H, FFN F, L layers):
//     2*E*H (factorized embedding projection, when E != H)
//     + L * (2*4*H^2 (Q, K, V, output) + 2*2*H*F (FFN) + 2*2*length*H (scores and weighted sum))
//   generator head at the masked share r (objectives.mask_ratio): r * 2*(H_g*E + E*V)
//   discriminator head: 2*(H^2 + H)
// The MLM baselines (objectives.set mlm, mlm+tlm) have one encoder with the generator-style head.
// Distillation (objectives.set distill) trains the student (its forward x 3) and runs the frozen
// `teacher` forward only, each through the layers it needs; with R the relation FLOPs
// 3 * 2*length*H (the Q-Q, K-K and V-V scores of every relation head) and P = 2*3*H^2 the Q, K,
// V projections of one layer:
//   student: 2*E*H + (L-1) * layer + (P, or a whole layer with distill.hidden_cosine > 0) + R
//   teacher: 2*E*H + (l-1) * layer + (P, or the layers l..L with hidden_cosine) + R
//   training: 3 * student + teacher              (l = the teacher's distilled layer)
// Embedding look-ups, softmax, LayerNorm and sampling are left out (a few percent).
double training_flops_per_token(const config::Config& config, int64_t length,
                                const model::Teacher* teacher = nullptr);
// The mean over the tasks of the step at their maximum lengths (MRTD at data.mono.max_len, TRTD
// at data.para.max_len, equal token budgets): a configuration's nominal figure (--print-model,
// --benchmark). Training counts each micro-batch at its own length (StepRecord::flops).
double step_flops_per_token(const config::Config& config, const model::Teacher* teacher = nullptr);

// Dense bf16 peak FLOP/s of a GPU from its name: H100 (SXM) and H200 989e12, H100 PCIe 756e12,
// A100 312e12; nullopt for other names.
std::optional<double> peak_bf16_flops(const std::string& device_name);
// The CUDA device's name, "cpu" for the CPU.
std::string device_name(const torch::Device& device);
// MFU: model FLOP/s of the whole job (all ranks) over the job's peak, `ranks` x the peak of
// `device_name`; nullopt on the CPU or an unknown GPU.
std::optional<double> model_flops_utilization(double flops_per_second,
                                              const std::string& device_name, int ranks);

}  // namespace xlme::train
